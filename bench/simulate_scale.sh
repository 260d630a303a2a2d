#!/usr/bin/env bash
# The issue's scale requirement, end to end through the CLI: `echelon simulate` of 1,000
# workers for 1,000 learner steps must finish in under 60 s on this machine.
# Usage: bench/simulate_scale.sh [path/to/echelon]   (run from the repository root)
set -euo pipefail
ECHELON=${1:-build/echelon}
start=$(date +%s.%N)
"$ECHELON" simulate configs/simulate-large.yaml --workers 1000 --steps 1000 --out /tmp/simulate_scale.jsonl | tail -1 > /tmp/simulate_scale.json
end=$(date +%s.%N)
wall=$(echo "$end - $start" | bc)
steps=$(wc -l < /tmp/simulate_scale.jsonl)
echo "simulate 1000 workers x $steps steps: ${wall} s wall (limit 60 s)"
cat /tmp/simulate_scale.json
[ "$steps" -eq 1000 ] && awk -v w="$wall" 'BEGIN { exit !(w < 60) }'
