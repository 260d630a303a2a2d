#!/usr/bin/env bash
# Staleness sweep: the same task, seed and learner-step budget at S in {0, 1, 2, 4, 8, 16}
# (kappa as the config derives it: max(1, S - 1)), with deliberately heterogeneous actors
# (some slowed down) so that staleness actually occurs; then the off-policy corrections
# (none, tis, decoupled) at one large S. Writes, under --out:
#   S<S>/, corr-<name>/     one run directory each (echelon train)
#   sweep.md                markdown tables (final held-out accuracy, wall time, learner busy
#                           fraction, consumed staleness, dropped/re-issued groups, accuracy
#                           against wall time)
#   report.html             `echelon report` over the S sweep; corrections.html over the
#                           correction runs
#   commands.txt            every command that was run (appended; reused runs noted)
#
# Usage: bench/staleness_sweep.sh [--steps N] [--out DIR] [--echelon PATH] [--s-list "0 1 2 4 8 16"]
#                                 [--correction-s S] [--corrections "none tis decoupled"]
#                                 [--actors N] [--slow-actors N] [--slowdown F] [--eval-every N]
#                                 [--config FILE] [--set key=value ...]
# An S may be `auto` (rl.staleness: auto, dir Sauto); corrections are any of none, tis, decoupled,
# icepop, m2po. Several seeds of a setting: bench/staleness_seeds.sh.
# Defaults: 300 steps, 3 actors of which 2 run 4x slower, correction runs at S = 16. The run
# with correction "none" at --correction-s is the S sweep's own run when that S is in the
# list (same config, so it is reused rather than trained twice).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STEPS=300
OUT=""
ECHELON="$ROOT/build/echelon"
S_LIST="0 1 2 4 8 16"
CORR_S=16
CORRECTIONS="none tis decoupled"
ACTORS=3
SLOW=2
SLOWDOWN=4
EVAL_EVERY=""
CONFIG="$ROOT/configs/math-tiny.yaml"
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --echelon) ECHELON=$2; shift 2 ;;
    --s-list) S_LIST=$2; shift 2 ;;
    --correction-s) CORR_S=$2; shift 2 ;;
    --corrections) CORRECTIONS=$2; shift 2 ;;
    --actors) ACTORS=$2; shift 2 ;;
    --slow-actors) SLOW=$2; shift 2 ;;
    --slowdown) SLOWDOWN=$2; shift 2 ;;
    --eval-every) EVAL_EVERY=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --set) EXTRA+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "staleness_sweep.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$ECHELON" ] || { echo "staleness_sweep.sh: $ECHELON is not an executable (build first: make build)" >&2; exit 2; }
[ -n "$OUT" ] || OUT="$ROOT/runs/staleness-sweep-$(date -u +%Y%m%d-%H%M%S)"
# Four intermediate held-out evaluations give the accuracy-against-wall-time curve.
[ -n "$EVAL_EVERY" ] || EVAL_EVERY=$(( STEPS / 5 > 0 ? STEPS / 5 : 1 ))
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CMDS="$OUT/commands.txt"
echo "# $(date -u +%FT%TZ) bench/staleness_sweep.sh --steps $STEPS (appended on every invocation)" >> "$CMDS"

COMMON=(--set rl.steps="$STEPS" --set rollout.actors="$ACTORS" --set rollout.slow_actors="$SLOW"
        --set rollout.slowdown="$SLOWDOWN" --set rollout.transport=threads --set eval.every="$EVAL_EVERY"
        "${EXTRA[@]}")

train() {  # train RUN_DIR extra --set args...
  local dir=$1; shift
  if [ -s "$dir/metrics.jsonl" ] && grep -q '"event":"final"' "$dir/metrics.jsonl"; then
    echo "== $dir exists, reusing"
    echo "# reused $dir" >> "$CMDS"
    return 0
  fi
  rm -rf "$dir"
  local cmd=("$ECHELON" train "$CONFIG" --out "$dir" "${COMMON[@]}" "$@")
  echo "${cmd[*]}" >> "$CMDS"
  echo "== ${cmd[*]}"
  local t0=$SECONDS load0
  load0=$(cut -d' ' -f1 /proc/loadavg)
  "${cmd[@]}" > "$dir.log" 2>&1 || { echo "staleness_sweep.sh: run failed, see $dir.log" >&2; tail -5 "$dir.log" >&2; exit 1; }
  # Machine load (1-minute load average) at start and end: other work on the host changes wall times.
  echo "$load0 $(cut -d' ' -f1 /proc/loadavg)" > "$dir/loadavg.txt"
  echo "   done in $((SECONDS - t0)) s: $(tail -1 "$dir/metrics.jsonl" | cut -c1-120)..."
}

S_DIRS=()
for s in $S_LIST; do
  train "$OUT/S$s" --set rl.staleness="$s" --set rl.correction=none
  S_DIRS+=("$OUT/S$s")
done
C_DIRS=()
for c in $CORRECTIONS; do
  dir="$OUT/corr-$c"
  if [ "$c" = none ] && [ -d "$OUT/S$CORR_S" ] && [ ! -e "$dir" ]; then
    ln -s "S$CORR_S" "$dir"
    echo "== $dir -> S$CORR_S (same config)"
  else
    train "$dir" --set rl.staleness="$CORR_S" --set rl.correction="$c"
  fi
  C_DIRS+=("$dir")
done

"$ECHELON" report "${S_DIRS[@]}" --out "$OUT/report.html"
echo "$ECHELON report ${S_DIRS[*]} --out $OUT/report.html" >> "$CMDS"
if [ ${#C_DIRS[@]} -gt 0 ]; then
  "$ECHELON" report "${C_DIRS[@]}" --out "$OUT/corrections.html"
  echo "$ECHELON report ${C_DIRS[*]} --out $OUT/corrections.html" >> "$CMDS"
fi

# Tables from each run's metrics.jsonl and config.yaml.
python3 - "$OUT" "${S_DIRS[@]}" -- "${C_DIRS[@]}" > "$OUT/sweep.md" <<'EOF'
import json, os, re, sys
out = sys.argv[1]
args = sys.argv[2:]
split = args.index("--")
s_dirs, c_dirs = args[:split], args[split + 1:]

def load(d):
    steps, final, warm = [], None, None
    for line in open(os.path.join(d, "metrics.jsonl")):
        if not line.strip():
            continue
        o = json.loads(line)
        if o.get("event") == "final":
            final = o
        elif o.get("event") == "warmstart":
            warm = o
        elif "step" in o:
            steps.append(o)
    cfg = open(os.path.join(d, "config.yaml")).read()
    def key(section, name):
        m = re.search(r"^%s:\n(?:  .*\n)*?  %s: (.*)$" % (section, name), cfg, re.M)
        return m.group(1).strip('"') if m else "?"
    return steps, final, warm, key

def staleness_dist(steps):
    hist = {}
    have = any("staleness_hist" in s for s in steps)
    for s in steps:
        if have:
            for k, n in s.get("staleness_hist", {}).items():
                hist[int(k)] = hist.get(int(k), 0) + n
        else:  # per-step mean, rounded: the metrics carry no per-group histogram
            k = int(round(s["staleness_mean"]))
            hist[k] = hist.get(k, 0) + 1
    total = sum(hist.values()) or 1
    return " ".join("%d:%d%%" % (k, round(100.0 * n / total)) for k, n in sorted(hist.items())), have

def row(d, label):
    steps, final, warm, key = load(d)
    rl_wall = steps[-1]["wall_s"] - warm["wall_s"]
    smean = sum(s["staleness_mean"] for s in steps) / len(steps)
    smax = max(s["staleness_max"] for s in steps)
    dist, exact = staleness_dist(steps)
    s_val, kappa = key("rl", "staleness"), key("rl", "publish_period")
    if kappa == "0":
        kappa = str(max(1, int(s_val) - 1)) if s_val.isdigit() else "1"  # rl.staleness: auto publishes every version
    issued = final.get("groups_issued", final.get("groups_handed_out", 0))
    load_file = os.path.join(d, "loadavg.txt")
    load_avg = "/".join(open(load_file).read().split()) if os.path.exists(load_file) else "?"
    cells = [label, s_val, kappa, "%.3f" % warm["heldout_accuracy"], "%.3f" % final["heldout_accuracy"],
             "%.0f" % rl_wall, "%.2f" % final["learner_busy_frac"], "%.2f / %d" % (smean, smax),
             dist, "%d" % final["groups_dropped_stale"], "%d" % final["groups_reissued"], "%d" % issued, load_avg]
    curve = ["%.3f@%.0fs" % (warm["heldout_accuracy"], 0.0)]
    for s in steps:
        if "heldout_accuracy" in s:
            curve.append("%.3f@%.0fs" % (s["heldout_accuracy"], s["wall_s"] - warm["wall_s"]))
    curve.append("%.3f@%.0fs" % (final["heldout_accuracy"], rl_wall))
    return cells, curve, exact

head = ("| run | S | kappa | warm-start held-out | final held-out | RL wall s | learner busy | "
        "staleness mean / max | consumed staleness | dropped stale | re-issued | issued | load start/end |")
sep = "|" + "---|" * 13
def table(dirs, title):
    print("### " + title + "\n")
    print(head)
    print(sep)
    curves, exact_all = [], True
    for d in dirs:
        cells, curve, exact = row(d, os.path.basename(d))
        exact_all = exact_all and exact
        print("| " + " | ".join(cells) + " |")
        curves.append((os.path.basename(d), curve))
    print()
    print("Held-out accuracy against RL wall time (accuracy@seconds since RL start):\n")
    print("| run | curve |\n|---|---|")
    for name, c in curves:
        print("| %s | %s |" % (name, " ".join(c)))
    print()
    if not exact_all:
        print("(consumed staleness: share of steps by rounded per-step mean staleness; these "
              "metrics carry no per-group `staleness_hist`)\n")

table(s_dirs, "Staleness bound S")
if c_dirs:
    table(c_dirs, "Off-policy corrections at large S")
EOF
cat "$OUT/sweep.md"
echo "tables: $OUT/sweep.md  reports: $OUT/report.html$([ ${#C_DIRS[@]} -gt 0 ] && echo " $OUT/corrections.html")"
