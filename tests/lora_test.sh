#!/usr/bin/env bash
# System test of LoRA runs (learner.lora): `echelon train` with its actor processes over
# loopback gRPC and the snapshot broadcast. Checks: the adapters alone travel (every snapshot
# a small fraction of the whole model's bytes), the base weights leave the run bit for bit as
# the warm-start made them (read with plain Python, not echelon), the run checkpoints carry the
# adapters and `echelon eval` reads them, the final model has them merged (a plain checkpoint,
# the same accuracy), a resume continues the run, and a resume with other adapters is refused
# naming the key.
# Usage: tests/lora_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
source "$(dirname "$0")/lib.sh"
enter_workdir

TINY=(--set warmstart.steps=30 --set task.eval_size=40 --set eval.every=0 --set rl.groups_per_step=4
      --set checkpoint.every=5 --set learner.lora.rank=4 --set rl.lr=0.003)
timeout 300 "$ECHELON" train "$CONFIG" --out run "${TINY[@]}" --set rl.steps=10 > train.out 2> train.err
check "train exits 0" test $? -eq 0
check "the run says what it trains" grep -q '^LoRA rank 4 alpha 16 on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj: [0-9]* adapter parameters' train.out
check "10 steps" test "$(grep -c '^step ' train.out)" -eq 10
actor_log=$(find run -name actor-0.log | head -1)
check "the actor pulled the base once ($actor_log)" test "$(grep -c 'pulled the LoRA base' "$actor_log")" -eq 1

# Every broadcast snapshot is the adapters: under a tenth of the whole model's bytes.
base_bytes=$(stat -c %s run/checkpoints/warmstart/model.safetensors)
python3 - "$base_bytes" run/metrics.jsonl > sizes.out <<'PY'
import json, sys
base = int(sys.argv[1])
sizes = [json.loads(l)["broadcast_snapshot_bytes"] for l in open(sys.argv[2]) if '"broadcast_snapshot_bytes"' in l]
print(len(sizes), max(sizes) if sizes else 0, base)
sys.exit(0 if sizes and max(sizes) * 10 < base else 1)
PY
check "snapshots are adapter sized (count, largest, whole model: $(cat sizes.out))" test $? -eq 0

# The base weights of the last run checkpoint are the warm-start's, byte for byte; the
# adapters are there besides, and config.json names them.
python3 - run/checkpoints/warmstart/model.safetensors run/checkpoints/step-10/model.safetensors > frozen.out <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    head.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in head.items()}
base, final = tensors(sys.argv[1]), tensors(sys.argv[2])
adapters = [k for k in final if ".lora_" in k]
changed = [k for k in base if final.get(k) != base[k]]
print(len(base), len(adapters), changed[:3])
sys.exit(0 if adapters and not changed and set(final) == set(base) | set(adapters) else 1)
PY
check "base frozen, adapters added (base tensors, adapters, changed: $(cat frozen.out))" test $? -eq 0
check "step-10 config.json names the adapters" grep -q '"echelon_lora"' run/checkpoints/step-10/config.json
check "warm-start config.json has none" sh -c '! grep -q echelon_lora run/checkpoints/warmstart/config.json'
timeout 120 "$ECHELON" eval --checkpoint run/checkpoints/step-10 --data run/heldout.jsonl > eval.out 2> eval.err
check "eval reads the adapted checkpoint" sh -c "tail -n1 eval.out | grep -Eq '^\{\"accuracy\":[0-9.e-]+,\"n\":40\}$'"
# The final model has its adapters merged: a plain Hugging Face checkpoint, the same accuracy.
check "final config.json is plain" sh -c '! grep -q echelon_lora run/checkpoints/final/config.json'
check "final holds no adapter tensor" sh -c '! grep -aq lora_A run/checkpoints/final/model.safetensors'
timeout 120 "$ECHELON" eval --checkpoint run/checkpoints/final --data run/heldout.jsonl > final.out 2> final.err
check "eval of the merged final gives the adapted accuracy" test "$(tail -n1 final.out)" = "$(tail -n1 eval.out)"

# Resume continues with the adapters; other adapters are refused by name.
timeout 300 "$ECHELON" train --resume run --set rl.steps=14 > resume.out 2> resume.err
check "resume exits 0" test $? -eq 0
check "resume continues from step 10" grep -q '^resuming from .*step-10 (version 10)' resume.out
check "resume ends at step 14" grep -q '^step 14/14 ' resume.out
timeout 120 "$ECHELON" train --resume run --set rl.steps=20 --set learner.lora.rank=8 > other.out 2> other.err
check "resume with other adapters fails" test $? -ne 0
check "and names the key" grep -q 'differs from the run.s config.yaml in learner.lora.rank' other.out other.err
# LoRA with sharded parameters is refused at once, naming the keys.
timeout 60 "$ECHELON" train "$CONFIG" --out bad "${TINY[@]}" --set learner.shard=params > bad.out 2> bad.err
check "lora with shard params fails" test $? -ne 0
check "and names learner.shard" grep -q 'learner.lora.rank: LoRA does not take learner.shard: params' bad.out bad.err
finish
