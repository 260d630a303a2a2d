#!/usr/bin/env bash
# System test of a run with an authenticated attacker: a learner with per-worker tokens, two
# honest actors, and `echelon_testkit hostile-actor` holding twenty valid worker tokens, which
# throughout the run samples real groups and forges them (tests/tools/hostile_actor.cc): lies
# told while the worker is not yet suspect (the newest version claimed for a group sampled
# from the first snapshot, behaviour log-probs 19.9 nats low inside the loss's clamp, samples
# chosen from twice the group with their true log-probs, text of its own writing with its true
# log-probs, one token's log-prob 2.5 nats low, a completion of max_new_tokens tokens of its
# own, a version never published), then a log-prob of -1e30, another prompt's ids, zero- and
# two-turn episodes claiming reward 1, another actor's lease, a 50,000-token completion, the
# version lie and the cherry-pick as a suspect, an accepted group sent again; one token hoards leases
# under 12 names, one asks for a layer-ranged snapshot of every range. The run is open to
# untrusted workers (rollout.untrusted_workers), as such a fleet's should be.
# Checks: every structural forgery and unpublished version refused with its reason; the fresh
# lies either refused by recomputation (rollout.verify_fraction 0.15 here: some must be) or
# accepted, and then bounded: on every update no token's gradient weight exceeded the dual
# clip's c = 3 (max_token_weight; e^19.9 before it) and no group carried more than
# rl.max_group_share = 0.05 of the loss (group_share_max; 1/32 is a fair share); the hoarder
# held at most rollout.max_leases_per_worker leases across its 12 names; the learner's peak
# resident set once the ranged flood is over is printed; each worker with three strikes
# quarantined, no honest one; caught / tried is printed per kind; the run completes, the final weights are finite, and held-out accuracy is not below
# the warm-start's; it is printed beside that of an attack-free run of the same job and length
# (the two honest actors alone).
# Usage: tests/hostile_actor_test.sh path/to/echelon path/to/echelon_testkit
set -uo pipefail
ECHELON=$(realpath "$1")
TESTKIT=$(realpath "$2")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
source "$(dirname "$0")/lib.sh"
enter_workdir
need_jq
token() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
for w in honest-0 honest-1; do echo "$w $(token)"; done > honest
for i in $(seq 0 19); do echo "hostile-$i $(token)"; done > hostile
cat honest hostile > workers
STEPS=400
timeout 900 "$ECHELON" learner "$CONFIG" --listen 127.0.0.1:0 --token-file workers --out run \
  --set rl.steps=$STEPS --set eval.every=0 --set rollout.verify_fraction=0.15 --set rl.publish_period=2 \
  --set rl.max_group_share=0.05 --set rollout.untrusted_workers=true \
  > learner.out 2> learner.err &
LEARNER=$!
PIDS+=("$LEARNER")
port=$(learner_port learner.out)
check "learner listens" test -n "$port"
for w in honest-0 honest-1; do
  awk -v w=$w '$1 == w {print $2}' honest > $w.token
  "$ECHELON" actor --learner "127.0.0.1:$port" --name $w --token-file $w.token > $w.out 2> $w.err &
  PIDS+=("$!")
done
"$TESTKIT" hostile-actor "127.0.0.1:$port" hostile hostile.jsonl 600 1 2 > hostile.out 2> hostile.err &
HOSTILE=$!
PIDS+=("$HOSTILE")
# The learner's peak resident set once the ranged flood is over (the flood comes before the lies).
for _ in $(seq 600); do grep -q ranged_flood hostile.jsonl 2>/dev/null && break; sleep 0.5; done
learner_pid=$(cat /proc/$LEARNER/task/$LEARNER/children 2>/dev/null | awk '{print $1}')  # under timeout
flood_rss=$(awk '/VmHWM/ {print $2}' /proc/${learner_pid:-$LEARNER}/status 2>/dev/null)
wait "$LEARNER"
check "learner completes the run with an attacker" test $? -eq 0
check "all steps ran" test "$(grep -c '^step ' learner.out)" -eq $STEPS
wait_exit "$HOSTILE" 60 > /dev/null

# Every forgery was tried and refused with its reason; the honest group went in once.
expect() {  # kind reason
  check "$1 was tried" test "$(jq -c "select(.kind == \"$1\")" hostile.jsonl | wc -l)" -ge 1
  check "every $1 refused as $2" test "$(jq -c "select(.kind == \"$1\" and (.accepted or .reason != \"$2\"))" hostile.jsonl | wc -l)" -eq 0
}
expect bad_logprob bad_logprob
expect swapped_prompt prompt_mismatch
expect zero_turns bad_turn_count
expect two_turns bad_turn_count
expect too_long too_long
expect foreign_lease foreign_lease
expect stale_version logprob_mismatch
# A worker that chooses its samples (true log-probs) is caught by the seeded draws: every
# refused cherry-pick as sample_not_drawn, and those told as a suspect always.
check "every refused cherry_pick refused as sample_not_drawn" \
  test "$(jq -c 'select(.kind == "cherry_pick" and (.accepted | not) and .reason != "sample_not_drawn")' hostile.jsonl | wc -l)" -eq 0
check "cherry-picks refused" \
  test "$(jq -c 'select(.kind == "cherry_pick" and (.accepted | not))' hostile.jsonl | wc -l)" -ge 1
expect replay already_settled
check "a ranged snapshot was asked for every layer range" test "$(jq -c 'select(.kind == "ranged_flood" and .asked >= 6)' hostile.jsonl | wc -l)" -eq 1
check "no ranged snapshot served to an actor that is no pipeline stage" test "$(jq -c 'select(.kind == "ranged_flood" and .served == 0)' hostile.jsonl | wc -l)" -eq 1
expect unpublished_version unpublished_version
# Lies told before any strike are checked only when drawn: refused by recomputation, or
# accepted and bounded by the loss (below).
LIES='["in_clamp", "fresh_version", "cherry_pick", "teacher_forced", "sparse_liar", "length"]'
for kind in $(jq -r '.[]' <<< "$LIES"); do
  check "$kind was tried" test "$(jq -c "select(.kind == \"$kind\")" hostile.jsonl | wc -l)" -ge 1
  check "every refused $kind refused by recomputation" \
    test "$(jq -c "select(.kind == \"$kind\" and (.accepted | not) and .reason != \"logprob_mismatch\" and .reason != \"sample_not_drawn\")" hostile.jsonl | wc -l)" -eq 0
  echo "$kind: caught $(jq -c "select(.kind == \"$kind\" and (.accepted | not))" hostile.jsonl | wc -l) of $(jq -c "select(.kind == \"$kind\")" hostile.jsonl | wc -l)"
done
fresh=$(jq -c --argjson lies "$LIES" 'select(.kind | IN($lies[]))' hostile.jsonl | wc -l)
caught=$(jq -c --argjson lies "$LIES" 'select((.kind | IN($lies[])) and (.accepted | not))' hostile.jsonl | wc -l)
echo "fresh lies: $fresh, refused by recomputation: $caught"
check "some fresh lies refused by recomputation ($caught of $fresh at verify_fraction 0.15)" test "$caught" -ge 1
check "the honest group was accepted" test "$(jq -c 'select(.kind == "honest" and .accepted)' hostile.jsonl | wc -l)" -eq 1
check "no structural forgery accepted" \
  test "$(jq -c --argjson lies "$LIES" 'select(.kind != "honest" and (.kind | IN($lies[]) | not) and .accepted)' hostile.jsonl | wc -l)" -eq 0
# The bound: every update's largest token gradient weight w r is at most c = 3 (rl.correction
# none: w = 1, the dual clip's c), whatever was accepted.
steps_over=$(grep '"step"' run/metrics.jsonl | jq -c 'select(.max_token_weight > 3.000001)' | wc -l)
check "no update let one token's gradient weigh more than 3 ($steps_over over)" test "$steps_over" -eq 0
echo "largest token gradient weight: $(grep '"step"' run/metrics.jsonl | jq -s 'map(.max_token_weight) | max')"
# A length attacker's accepted group weighs no more than the cap, whatever its length.
shares_over=$(grep '"step"' run/metrics.jsonl | jq -c 'select(.group_share_max > 0.050001)' | wc -l)
check "no update let one group carry more than 0.05 of the loss ($shares_over over)" test "$shares_over" -eq 0
echo "largest group share of any update: $(grep '"step"' run/metrics.jsonl | jq -s 'map(.group_share_max) | max')"
hoarded=$(jq -r 'select(.kind == "hoard") | .leases' hostile.jsonl)
check "the hoarder registered 12 names with its one token" test "$(jq -r 'select(.kind == "hoard") | .names' hostile.jsonl)" = 12
check "the hoarder held at most 8 leases across its 12 names ($hoarded)" test "${hoarded:-99}" -le 8
echo "learner peak resident set after the ranged-snapshot flood: $((${flood_rss:-0} / 1024)) MiB"
check "the hoarder was held off" test "$(grep '"step"' run/metrics.jsonl | tail -1 | jq '.refused.lease_capped // 0')" -ge 1
# A worker is quarantined at its third refused forgery (an honest refusal is no strike).
forgers=$(jq -r 'select(.accepted | not) | select(.reason != "already_settled" and .reason != "not_lease_holder") | .worker' \
  hostile.jsonl | sort | uniq -c | awk '$1 >= 3' | wc -l)
check "several workers forged ($forgers)" test "$forgers" -ge 6
check "each worker with three strikes quarantined" test "$(grep -c 'quarantined worker hostile-' learner.err)" -eq "$forgers"
check "no honest worker quarantined" test "$(grep -c 'quarantined worker honest-' learner.err)" -eq 0

final=$(grep '"event":"final"' run/metrics.jsonl)
accepted_lies=$(jq -c 'select(.kind != "honest" and .accepted)' hostile.jsonl | wc -l)
check "the attacker's accepted groups are the honest one and the accepted fresh lies" \
  test "$(echo "$final" | jq -c '.actor_groups | with_entries(select(.key | startswith("hostile"))) | add')" = $((1 + accepted_lies))
check "honest actors did the run" test "$(echo "$final" | jq '.actor_groups["honest-0"] + .actor_groups["honest-1"]')" -gt 1000
check "forgeries counted per worker" test "$(echo "$final" | jq '[.actor_forged[]] | add')" -ge "$((2 * forgers))"
acc=$(echo "$final" | jq .heldout_accuracy)
warm=$(echo "$final" | jq .warmstart_heldout_accuracy)
echo "held-out accuracy: warm-start $warm -> final $acc; honest gap $(grep '"step"' run/metrics.jsonl | tail -1 | jq .verify_gap_max)"
check "held-out accuracy not below the warm-start's" jq -ne "$acc >= $warm"
/usr/bin/python3 - run/checkpoints/final/model.safetensors > finite.out <<'PY'
import json, math, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
bad = 0
for name, t in header.items():
    if name == "__metadata__": continue
    assert t["dtype"] == "F32", t["dtype"]
    a, b = t["data_offsets"]
    values = struct.unpack("<%df" % ((b - a) // 4), data[8 + n + a:8 + n + b])
    bad += sum(1 for v in values if not math.isfinite(v))
print(bad)
PY
check "final weights finite" test "$(cat finite.out)" = 0

# The same job without the attacker, for the held-out accuracy side by side.
timeout 900 "$ECHELON" learner "$CONFIG" --listen 127.0.0.1:0 --token-file workers --out clean \
  --set rl.steps=$STEPS --set eval.every=0 --set rollout.verify_fraction=0.15 --set rl.publish_period=2 \
  --set rl.max_group_share=0.05 --set rollout.untrusted_workers=true > clean.out 2> clean.err &
LEARNER=$!
PIDS+=("$LEARNER")
port=$(learner_port clean.out)
for w in honest-0 honest-1; do
  "$ECHELON" actor --learner "127.0.0.1:$port" --name $w --token-file $w.token > clean-$w.out 2> clean-$w.err &
  PIDS+=("$!")
done
wait "$LEARNER"
check "the attack-free run completes" test $? -eq 0
clean_acc=$(grep '"event":"final"' clean/metrics.jsonl | jq .heldout_accuracy)
echo "held-out accuracy after $STEPS updates: $acc with the attacker, ${clean_acc:-?} without (warm-start $warm)"
[ "$fails" -eq 0 ] || { tail -n 5 learner.err hostile.err; }
finish
