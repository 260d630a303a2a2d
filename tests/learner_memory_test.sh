#!/usr/bin/env bash
# `echelon plan --learner-memory MODEL --measure`: the real learner goes through a run's phases
# (set-up, two updates, a publication, a checkpoint save, a resume) on random weights of the
# 126M-parameter Qwen3 (data/models/qwen3-126m.json), its ranks as processes, and every rank's
# measured peak resident set (VmHWM) per phase must be within 15% of the host memory model's
# estimate (learn/learner_memory.h EstimateHostPeak), which counts no copy the code no longer
# makes. Regressions, each a row that would be off by a whole copy of the weights (481 MiB,
# +20% or more) or of the AdamW state:
# - a checkpoint save serialised the weights and the AdamW state into whole-file strings (4.5 GB
#   peak at one rank, 2.1 GB now);
# - a worker rank kept the whole fp32 model it had received at set-up for the whole run, and the
#   sharded learner built a whole randomly initialised compute model before emptying it;
# - under shard params a worker received the whole weights at set-up, and the whole AdamW state
#   at a resume, before cutting its shards (954 and 1,935 MiB at 2 ranks; 505 and 985 now);
# - under shard params rank 0 gathered the whole AdamW state before writing a checkpoint (2,716
#   MiB at 2 ranks; 1,881 now);
# - several ranks' gradient exchange held the old gradients, the summed vector and a clone of it;
# - under shard params rank 0 kept the whole fp32 weights, all-gathered after every update, for
#   snapshots, evaluation and checkpoints (1,888 / 2,120 / 1,881 MiB at updates / publication /
#   checkpoint save at 2 ranks; 1,412 / 1,769 / 1,398 now, the snapshot gathered unit by unit).
# Usage: tests/learner_memory_test.sh path/to/echelon
set -uo pipefail
ECHELON=$(realpath "$1")
MODEL=$(realpath "$(dirname "$0")/../data/models/qwen3-126m.json")
MOE=$(realpath "$(dirname "$0")/../data/models/qwen3-moe-tiny.json")
source "$(dirname "$0")/lib.sh"
enter_workdir

# Whether the rows of PHASE in FILE (every phase when empty; rank RANK, or all) have their
# estimate within 15% of the measured peak.
within() {
  awk -v phase="$2" -v rank="${3:-}" '
    (phase == "" ? (/%$/ && $1 != "whole") : index($0, phase " ") == 1) && (rank == "" || $(NF - 4) == rank) {
      n++; e = $NF; sub("%", "", e); e += 0; if (e > 15 || e < -15) { print "off: " $0; bad = 1 } }
    END { exit (bad || n == 0) }' "$1"
}

for setup in "--ranks 1" "--ranks 2 --shard params" "--ranks 2 --shard optimizer"; do
  name=$(echo "$setup" | tr -d ' -')
  # shellcheck disable=SC2086
  timeout 400 "$ECHELON" plan --learner-memory "$MODEL" --measure $setup --tokens 512 --out "$name" \
    > "$name.out" 2> "$name.err"
  check "$setup: exits 0" test $? -eq 0
  cat "$name.out"
  ranks=${setup#--ranks }
  ranks=${ranks%% *}
  check "$setup: 5 phases x $ranks rank(s) read" \
    test "$(grep -cE '^(set-up|updates|publication|checkpoint save|resume) ' "$name.out")" -eq $((5 * ranks))
  check "$setup: the checkpoint it resumed from is in --out" test -f "$name/checkpoints/step-2/optimizer.safetensors"
  for phase in set-up updates publication resume; do
    check "$setup: $phase within 15% of the estimate" within "$name.out" "$phase"
  done
  check "$setup: a checkpoint save streams its files (no whole-file copy of weights or AdamW state)" \
    within "$name.out" "checkpoint save"
done
check "a worker rank keeps no whole copy of the weights after set-up (shard params, resting at publication)" \
  within ranks2shardparams.out publication 1
check "shard params: a worker holds no whole model at set-up (rank 0 sends each unit, it keeps its shard)" \
  within ranks2shardparams.out set-up 1
check "shard params: nor at the resume, of the weights or the AdamW state" within ranks2shardparams.out resume 1
check "shard params: rank 0 writes the AdamW state as it is gathered (never whole) at a checkpoint save" \
  within ranks2shardparams.out "checkpoint save" 0
check "shard params: rank 0 keeps no whole copy of the weights between updates" within ranks2shardparams.out updates 0
check "shard params: rank 0 gathers a snapshot unit by unit into its bytes" within ranks2shardparams.out publication 0
check "the gradient exchange holds one more set of gradients, not two (shard optimizer, updates)" \
  within ranks2shardoptimizer.out updates
# Regression: a mixture of experts whose unreached experts had no AdamW state wrote a checkpoint
# its own resume refused ("optimizer state covers 404 of 422 parameters").
timeout 400 "$ECHELON" plan --learner-memory "$MOE" --measure --tokens 512 > moe.out 2> moe.err
check "a mixture of experts with experts no token reached resumes from its checkpoint" test $? -eq 0
cat moe.out moe.err
check "... every phase within 15% of the estimate" within moe.out ""
finish
