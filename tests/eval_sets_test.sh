#!/usr/bin/env bash
# System test of evaluation as work (eval.sets, learn/eval_rounds.h) in a real run over two actor
# processes. Two sets: "greedy" at temperature 0 with k 2, whose every sample is the greedy
# completion, so its mean@2 and pass@2 both equal the greedy accuracy that `echelon eval` gives
# independently on the checkpoint of the round's version (which proves each round sampled its
# pinned snapshot, whatever snapshot the actors held then); and "sampled" at temperature 0.5
# with k 4, every group of which the verifier recomputes (rollout.verify_fraction 1) at that
# temperature, not the run's 1.0; and canaries, a fifth of new groups, mixed into the training
# work. Checks: one metrics line per set and round (versions 0, 3, 6),
# with the set's prompts and k; nothing refused; the TensorBoard scalars' tags; and a clear error
# for a set whose file is missing; the report's chart of the sets; the run's invariants; each
# worker's canary tally in actor_stats, within the groups settled as filtered; checkpoints/final
# in Hugging Face's sharded layout (checkpoint.shard_mb), which `echelon eval` reads above; a run
# with eval.heldout false (no evaluation on the learner) that resumes.
#
#   bash tests/eval_sets_test.sh ECHELON_BINARY
set -uo pipefail
ECHELON=$(realpath "${1:?usage: eval_sets_test.sh ECHELON_BINARY}")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
INVARIANTS=$(realpath "$(dirname "$0")/run_invariants.py")
source "$(dirname "$0")/lib.sh"
enter_workdir

/usr/bin/python3 - <<'PY'
import json
with open("greedy.jsonl", "w") as g, open("sampled.jsonl", "w") as s:
    for i in range(40):
        a, b = (7 * i) % 50, (11 * i + 3) % 50
        g.write(json.dumps({"question": f"{a}+{b}", "answer": str(a + b)}) + "\n")
        s.write(json.dumps({"question": f"{b}+{a}", "answer": str(a + b)}) + "\n")
with open("canaries.jsonl", "w") as c:
    for i in range(10):
        c.write(json.dumps({"question": f"{i}+{i}", "answer": str(2 * i)}) + "\n")
PY

SETS=(eval.sets.greedy.file=greedy.jsonl eval.sets.greedy.k=2 eval.sets.greedy.temperature=0
      eval.sets.sampled.file=sampled.jsonl eval.sets.sampled.k=4 eval.sets.sampled.temperature=0.5
      eval.canaries.file=canaries.jsonl eval.canaries.share=0.2)
timeout 400 "$ECHELON" train "$CONFIG" --out run rl.steps=6 warmstart.steps=300 task.eval_size=50 eval.every=3 \
  checkpoint.every=3 checkpoint.shard_mb=1 rollout.actors=2 rl.groups_per_step=8 rollout.verify_fraction=1 secret=seed "${SETS[@]}" \
  > train.out 2> train.err
check "the run exits 0" test $? -eq 0
check "progress names each set's round" grep -q '^eval v3 sampled: mean@4 [0-9.]* pass@4 [0-9.]* (40 prompts' train.out

/usr/bin/python3 - run/metrics.jsonl > metrics.check 2>&1 <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
evals = [l for l in lines if l.get("event") == "eval"]
got = sorted((e["version"], e["set"]) for e in evals)
assert got == [(v, s) for v in (0, 3, 6) for s in ("greedy", "sampled")], got
for e in evals:
    r = e["eval/" + e["set"]]
    assert r["prompts"] == 40 and r["k"] == (2 if e["set"] == "greedy" else 4), e
    assert 0 <= r["mean_at_k"] <= r["pass_at_k"] <= 1, e
    if e["set"] == "greedy":
        assert r["mean_at_k"] == r["pass_at_k"], e  # two identical greedy samples
final = [l for l in lines if l.get("event") == "final"][0]
assert final["refused"] == {}, final["refused"]
# Canaries: tallied per worker, settled as filtered (no dynamic sampling here), never consumed.
last = [l for l in lines if "step" in l][-1]
canaries = {w: s.get("canary_groups", 0) for w, s in last["actor_stats"].items()}
assert all(n > 0 for n in canaries.values()) and len(canaries) == 2, last["actor_stats"]
assert sum(canaries.values()) <= final["groups_filtered"], (canaries, final["groups_filtered"])
assert all(0 <= s["canary_pass"] <= 1 for s in last["actor_stats"].values()), last["actor_stats"]
for e in evals:
    if e["set"] == "greedy":
        print(e["version"], repr(e["eval/greedy"]["mean_at_k"]))
PY
check "one line per set and round, nothing refused" test $? -eq 0
cat metrics.check

# The greedy set's figures are `echelon eval`'s accuracy on the checkpoint of that version.
for pair in "3 run/checkpoints/step-3" "6 run/checkpoints/final"; do
  set -- $pair
  timeout 120 "$ECHELON" eval --checkpoint "$2" --data greedy.jsonl --max-new-tokens 6 > "eval-$1.json" 2> "eval-$1.err"
  check "echelon eval of $2 exits 0" test $? -eq 0
  want=$(/usr/bin/python3 -c 'import json,sys; print(repr(json.load(open(sys.argv[1]))["accuracy"]))' "eval-$1.json")
  got=$(awk -v v="$1" '$1 == v {print $2}' metrics.check)
  check "greedy mean@2 at v$1 ($got) is echelon eval's accuracy of $2 ($want)" \
    /usr/bin/python3 -c 'import sys; assert abs(float(sys.argv[1]) - float(sys.argv[2])) < 1e-12' "$got" "$want"
done
check "the greedy set is not all wrong (the comparison means something)" \
  awk '$1 == 6 && $2 > 0 {ok = 1} END {exit !ok}' metrics.check

# checkpoints/final in Hugging Face's sharded layout (checkpoint.shard_mb 1): read here with a
# reader of our own, its tensors are byte for byte those of the run checkpoint of the same version.
/usr/bin/python3 - run/checkpoints/final run/checkpoints/step-6 > shards.check 2>&1 <<'PY'
import json, os, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}
final, step = sys.argv[1], sys.argv[2]
index = json.load(open(os.path.join(final, "model.safetensors.index.json")))
assert not os.path.exists(os.path.join(final, "model.safetensors"))
files = sorted(set(index["weight_map"].values()))
assert len(files) >= 2 and all(f.endswith("-of-%05d.safetensors" % len(files)) for f in files), files
got = {}
for f in files:
    t = tensors(os.path.join(final, f))
    assert all(index["weight_map"][k] == f for k in t), f
    assert sum(len(b) for _, _, b in t.values()) <= 1000000 or len(t) == 1, f
    got.update(t)
want = tensors(os.path.join(step, "model.safetensors"))
assert got == want, sorted(set(got) ^ set(want))
assert index["metadata"]["total_size"] == sum(len(b) for _, _, b in got.values())
print(len(files), "shards,", len(got), "tensors")
PY
check "the final checkpoint's shards hold the run checkpoint's tensors" test $? -eq 0
cat shards.check

# The TensorBoard event file holds each set's scalars at the round's version.
check "TensorBoard tags" grep -aq 'eval/sampled/pass_at_k' run/events.out.tfevents.*

timeout 60 "$ECHELON" report run --out report.html > report.out 2>&1
check "the report draws each set's mean@k and pass@k" grep -q 'run sampled pass@4' report.html
check "the run keeps the invariants (the final line last)" \
  /usr/bin/python3 "$INVARIANTS" run/metrics.jsonl --staleness 2 --steps 6 --batch 8 --end final

# eval.heldout false: the learner evaluates nothing itself (no copy, no greedy pass); the sets
# still run on the actors, and the run resumes (its warm-start accuracy is null, not a number).
timeout 120 "$ECHELON" train "$CONFIG" --out quiet rl.steps=3 warmstart.steps=20 eval.every=0 eval.heldout=false \
  rollout.transport=threads "${SETS[@]:0:3}" > quiet.out 2> quiet.err
check "a run without the learner's held-out evaluation exits 0" test $? -eq 0
check "... says so" grep -q '^held-out accuracy: not evaluated (eval.heldout false' quiet.out
check "... never prints a warm-start accuracy" test "$(grep -c 'warm-start held-out accuracy' quiet.out)" -eq 0
timeout 120 "$ECHELON" train --resume quiet --set rl.steps=5 > quiet-resumed.out 2>&1
check "... and resumes" test $? -eq 0
/usr/bin/python3 - quiet/metrics.jsonl > quiet.check 2>&1 <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
for l in lines:
    if l.get("event") in ("warmstart", "final"):
        assert l["heldout_accuracy"] is None, l
    assert "step" not in l or "heldout_accuracy" not in l, l
assert sorted(l["version"] for l in lines if l.get("event") == "eval") == [0, 3, 5], [l for l in lines if l.get("event") == "eval"]
PY
check "... with null held-out figures and a round of the set at v0, v3 and v5" test $? -eq 0
cat quiet.check

timeout 60 "$ECHELON" train "$CONFIG" --out bad rl.steps=1 warmstart.steps=0 eval.sets.x.file=missing.jsonl \
  > bad.out 2> bad.err
check "a missing set file is refused" test $? -ne 0
check "the error names the set and the file" grep -q 'eval.sets.x.*missing.jsonl' bad.err
finish
