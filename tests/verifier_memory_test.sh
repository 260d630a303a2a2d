#!/usr/bin/env bash
# The verifier keeps the snapshots of every version within the staleness bound; they were all
# in the learner's memory (under rl.staleness: auto up to 65 whole models). Now only the newest
# is (the publisher holds it anyway) plus rollout.verify_memory_mb of older ones; the rest are
# files in RUN_DIR/verifier. Two runs of the same job, S = 8 and a snapshot every update, one
# with the default (0 MB: older snapshots on disk) and one keeping them all in memory: the
# learner's peak resident set (VmHWM, learner_peak_rss_mb) is lower by at least half of the
# 8 snapshots' bytes and within 20% of what the learner memory model says the 8 older snapshots
# take in RAM (`echelon plan --learner-memory`; the one mapped while its check runs is a
# transient the peak need not meet), and the run leaves no snapshot file behind.
# Usage: tests/verifier_memory_test.sh path/to/echelon
set -uo pipefail
source "$(dirname "$0")/lib.sh"
ECHELON=$(realpath "$1")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
PRICES=$(realpath "$(dirname "$0")/../data/prices.yaml")
enter_workdir
need_jq

S=8
for mb in 0 100000; do
  timeout 600 "$ECHELON" train "$CONFIG" --out "run-$mb" --set rollout.transport=threads --set warmstart.steps=0 \
    --set rl.steps=40 --set rl.staleness=$S --set rl.publish_period=1 --set rl.groups_per_step=8 \
    --set model.hidden_size=256 --set model.num_hidden_layers=4 --set model.intermediate_size=1024 \
    --set model.head_dim=64 --set eval.every=0 --set task.eval_size=20 --set rollout.verify_memory_mb=$mb \
    > "train-$mb.out" 2> "train-$mb.err"
  check "the run keeping $mb MB of older snapshots in memory completes" test $? -eq 0
done
snapshot=$(stat -c %s run-0/checkpoints/final/model.safetensors)
on_disk=$(jq -s 'map(select(.learner_peak_rss_mb)) | last | .learner_peak_rss_mb' run-0/metrics.jsonl)
in_ram=$(jq -s 'map(select(.learner_peak_rss_mb)) | last | .learner_peak_rss_mb' run-100000/metrics.jsonl)
saved=$(jq -n "$in_ram - $on_disk")
want=$(jq -n "$S * $snapshot / 2 / 1048576")
echo "peak resident set: $in_ram MB with every snapshot in memory, $on_disk MB with the older ones on disk" \
  "(saved $saved MB; $S snapshots of $((snapshot / 1048576)) MB)"
check "older snapshots on disk save at least half of $S snapshots ($saved >= $want MB)" jq -ne "$saved >= $want" > /dev/null
"$ECHELON" plan --learner-memory run-0/checkpoints/final --staleness $S --verify-memory-mb -1 --prices "$PRICES" \
  > plan.out 2> plan.err
model=$(sed -n 's/.*older snapshots \([0-9.]*\) MiB in RAM.*/\1/p' plan.out)
echo "the memory model's older snapshots in RAM: ${model:-?} MiB; measured saving $saved MB"
check "the memory model's older snapshots within 20% of the measured saving" \
  jq -ne "${model:-0} > 0 and ($saved - ${model:-0} | fabs) <= 0.2 * ${model:-0}" > /dev/null
check "the run leaves no verifier snapshot behind" test -z "$(ls run-0/verifier 2> /dev/null)"
[ "$fails" -eq 0 ] || tail -n 5 train-0.err train-100000.err
finish
