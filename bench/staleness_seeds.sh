#!/usr/bin/env bash
# Staleness against seeds: several settings of (S, correction), each trained with several RL
# seeds from ONE shared warm-start checkpoint, so that the seeds vary what RL varies (data order,
# sampling, thread timing) and not the starting model (as every user post-trains the same base
# model). Runs one at a time, the settings alternating within each seed so that a change in the
# host's load falls on all of them. Writes, under --out:
#   warmstart/                 the warm-start run (its checkpoints/warmstart starts every run)
#   <S>-<correction>-seed<k>/  one run directory each (echelon train)
#   seeds.md                   per run: final held-out accuracy, its curve, staleness, ESS,
#                              learner busy; per setting: mean, min..max over seeds, and the
#                              paired difference to the first setting (same seed)
#   report.html                `echelon report` over every run: per setting, held-out accuracy
#                              against wall time and the ESS fraction over updates as the mean
#                              over seeds with a min .. max band
#   commands.txt               every command that was run (appended; reused runs noted)
#
# Usage: bench/staleness_seeds.sh [--steps N] [--seeds "1 2 3"] [--settings "0:none 64:none"]
#                                 [--out DIR] [--echelon PATH] [--config FILE] [--eval-every N]
#                                 [--warmstart-seed K] [--set key=value ...]
# A setting is S:correction, S an integer or auto (rl.staleness). The first setting is the
# baseline of the paired differences. Defaults: 300 steps, seeds 1 2 3, settings 0:none 64:none,
# the config's own actors (configs/math-tiny.yaml: one actor process, so the learner is the
# bottleneck and a large S is used in full).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STEPS=300
SEEDS="1 2 3"
SETTINGS="0:none 64:none"
OUT=""
ECHELON="$ROOT/build/echelon"
CONFIG="$ROOT/configs/math-tiny.yaml"
EVAL_EVERY=100
WS_SEED=1
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --seeds) SEEDS=$2; shift 2 ;;
    --settings) SETTINGS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --echelon) ECHELON=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --eval-every) EVAL_EVERY=$2; shift 2 ;;
    --warmstart-seed) WS_SEED=$2; shift 2 ;;
    --set) EXTRA+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "staleness_seeds.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$ECHELON" ] || { echo "staleness_seeds.sh: $ECHELON is not an executable (build first: make build)" >&2; exit 2; }
for s in $SETTINGS; do
  [[ "$s" =~ ^([0-9]+|auto):[a-z0-9]+$ ]] || { echo "staleness_seeds.sh: setting '$s' is not S:correction" >&2; exit 2; }
done
[ -n "$OUT" ] || OUT="$ROOT/runs/staleness-seeds-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CMDS="$OUT/commands.txt"
echo "# $(date -u +%FT%TZ) bench/staleness_seeds.sh --steps $STEPS --seeds '$SEEDS' --settings '$SETTINGS' ${EXTRA[*]}" >> "$CMDS"

train() {  # train RUN_DIR args...
  local dir=$1; shift
  if [ -s "$dir/metrics.jsonl" ] && grep -q '"event":"final"' "$dir/metrics.jsonl"; then
    echo "# reused $dir" >> "$CMDS"
    return 0
  fi
  rm -rf "$dir"
  local cmd=("$ECHELON" train "$CONFIG" --out "$dir" "$@")
  echo "${cmd[*]}" >> "$CMDS"
  echo "== $(date -u +%T) $(basename "$dir")"
  local t0=$SECONDS
  "${cmd[@]}" > "$dir.log" 2>&1 || { echo "staleness_seeds.sh: run failed, see $dir.log" >&2; tail -5 "$dir.log" >&2; exit 1; }
  echo "   done in $((SECONDS - t0)) s: $(grep '"event":"final"' "$dir/metrics.jsonl" | cut -c1-100)..."
}

train "$OUT/warmstart" "${EXTRA[@]}" --set seed="$WS_SEED" --set rl.steps=1 --set eval.every=0
INIT="$OUT/warmstart/checkpoints/warmstart"
DIRS=()
for seed in $SEEDS; do
  for s in $SETTINGS; do
    dir="$OUT/${s%%:*}-${s##*:}-seed$seed"
    # --set options first: the run's own settings below win (a warmstart.steps in them is the
    # shared warm-start's, not every run's).
    train "$dir" "${EXTRA[@]}" --set model.init="$INIT" --set warmstart.steps=0 --set seed="$seed" \
      --set rl.steps="$STEPS" --set rl.staleness="${s%%:*}" --set rl.correction="${s##*:}" \
      --set eval.every="$EVAL_EVERY" --set checkpoint.every=0
    DIRS+=("$dir")
  done
done

"$ECHELON" report "${DIRS[@]}" --out "$OUT/report.html" > /dev/null
echo "$ECHELON report ${DIRS[*]} --out $OUT/report.html" >> "$CMDS"

python3 - "$OUT" $SETTINGS > "$OUT/seeds.md" <<'EOF'
import glob, json, os, statistics, sys
out, settings = sys.argv[1], sys.argv[2:]

def load(d):
    steps, final = [], None
    for line in open(os.path.join(d, "metrics.jsonl")):
        if not line.strip():
            continue
        o = json.loads(line)
        if o.get("event") == "final":
            final = o
        elif "step" in o and "event" not in o:
            steps.append(o)
    return steps, final

print("| run | warm-start | final held-out | curve (acc@update) | staleness mean / max | ESS mean / min | "
      "S at end | learner busy | RL wall s |")
print("|" + "---|" * 9)
finals = {}
for s in settings:
    label = s.replace(":", "-")
    runs = [d for d in glob.glob(os.path.join(out, label + "-seed*")) if os.path.isdir(d)]
    for d in sorted(runs, key=lambda p: int(p.rsplit("seed", 1)[1])):
        steps, final = load(d)
        if final is None or not steps:
            continue
        seed = int(d.rsplit("seed", 1)[1])
        finals.setdefault(s, {})[seed] = final["heldout_accuracy"]
        curve = " ".join("%.3f@%d" % (o["heldout_accuracy"], o["step"]) for o in steps if "heldout_accuracy" in o)
        ess = [o["is_ess_frac"] for o in steps if "is_ess_frac" in o]
        print("| %s | %.3f | **%.3f** | %s | %.1f / %d | %s | %s | %.2f | %.0f |" % (
            os.path.basename(d), final["warmstart_heldout_accuracy"], final["heldout_accuracy"], curve,
            statistics.mean(o["staleness_mean"] for o in steps), max(o["staleness_max"] for o in steps),
            "%.3f / %.3f" % (statistics.mean(ess), min(ess)) if ess else "-",
            steps[-1].get("staleness_bound", "-"), final["learner_busy_frac"], steps[-1]["wall_s"] - steps[0]["wall_s"]))
print()
base = settings[0]
print("| setting | seeds | final held-out mean | min .. max | paired difference to %s: mean (min .. max) |" % base)
print("|---|---|---|---|---|")
for s in settings:
    f = finals.get(s, {})
    if not f:
        continue
    v = list(f.values())
    diffs = [f[k] - finals[base][k] for k in f if k in finals.get(base, {})]
    diff = "%+.3f (%+.3f .. %+.3f)" % (statistics.mean(diffs), min(diffs), max(diffs)) if diffs and s != base else "-"
    print("| %s | %d | %.3f | %.3f .. %.3f | %s |" % (s, len(v), statistics.mean(v), min(v), max(v), diff))
EOF
cat "$OUT/seeds.md"
echo "tables: $OUT/seeds.md  report: $OUT/report.html"
