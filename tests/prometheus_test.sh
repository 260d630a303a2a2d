#!/usr/bin/env bash
# The learner's Prometheus endpoint (`--metrics-port`) checked by `promtool check metrics`
# (Debian's prometheus package), while a real run goes: HELP and TYPE on every series, running
# totals as counters named *_total that never decrease between two scrapes, base units, and the
# scraped counts equal to the metrics.jsonl line of the same update. Exits 77 when promtool is
# missing (fails under CI=true).
#
#   bash tests/prometheus_test.sh ECHELON_BINARY
set -uo pipefail
source "$(dirname "$0")/skip.sh"
command -v promtool > /dev/null || skip_or_fail "promtool (Debian package prometheus) is needed to check /metrics"
command -v curl > /dev/null || skip_or_fail "curl is needed to scrape /metrics"
ECHELON=$(realpath "${1:?usage: prometheus_test.sh ECHELON_BINARY}")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
source "$(dirname "$0")/lib.sh"
enter_workdir

"$ECHELON" train "$CONFIG" --out run --metrics-port 0 warmstart.steps=5 rl.steps=100000 task.eval_size=20 \
  eval.every=0 > train.out 2> train.err &
LEARNER=$!
PIDS+=("$LEARNER")
PORT=""
for _ in $(seq 1 600); do
  PORT=$(sed -n 's|^metrics at http://0.0.0.0:\([0-9]*\)/metrics$|\1|p' train.out 2>/dev/null)
  [ -n "$PORT" ] && [ "$(grep -c '"step"' run/metrics.jsonl 2>/dev/null)" -ge 3 ] && break
  sleep 0.1
done
check "the learner serves metrics and has taken 3 updates" test -n "$PORT"

scrape() { curl -sf "http://127.0.0.1:$PORT/metrics" > "$1"; }
scrape first.prom
sleep 2
scrape second.prom
check "promtool check metrics passes" promtool check metrics < second.prom
check "every series has HELP and TYPE" test "$(grep -c '^# HELP' second.prom)" -eq "$(grep -c '^# TYPE' second.prom)" \
  -a "$(grep -c '^# HELP' second.prom)" -ge 30
for name in echelon_groups_issued_total echelon_groups_consumed_total echelon_groups_reissued_total \
            echelon_groups_dropped_stale_total echelon_actor_groups_total; do
  check "$name is a counter" grep -qx "# TYPE $name counter" second.prom
done
for name in echelon_step echelon_loss echelon_step_seconds echelon_learner_resident_memory_bytes echelon_groups_in_flight; do
  check "$name is a gauge" grep -qx "# TYPE $name gauge" second.prom
done
check "no _s units left" sh -c "! grep -E '^echelon_[a-z_]*_s[ {]' second.prom"
value() { sed -n "s/^$1 \\([0-9.e+-]*\\)\$/\\1/p" "$2"; }
check "counters do not decrease between scrapes" python3 - first.prom second.prom <<'PY'
import sys
def counters(path):
    kinds, vals = {}, {}
    for line in open(path):
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            kinds[name] = kind
        elif line and not line.startswith("#"):
            series, v = line.rsplit(" ", 1)
            vals[series] = float(v)
    return {s: v for s, v in vals.items() if kinds.get(s.split("{")[0]) == "counter"}
a, b = counters(sys.argv[1]), counters(sys.argv[2])
bad = [s for s in a if s in b and b[s] < a[s]]
print("decreased:", bad) if bad else None
sys.exit(1 if bad or not a else 0)
PY
# A scrape between two updates matches metrics.jsonl's line of the update it shows (retry when
# the scrape fell while the learner was publishing).
matched=0
for _ in 1 2 3 4 5; do
  scrape now.prom
  step=$(value echelon_step now.prom)
  line=$(jq -c "select(.step == $step)" run/metrics.jsonl | tail -n1)
  if [ -n "$line" ] && [ "$(echo "$line" | jq .groups_consumed)" = "$(value echelon_groups_consumed_total now.prom)" ] &&
     [ "$(echo "$line" | jq .groups_issued)" = "$(value echelon_groups_issued_total now.prom)" ] &&
     [ "$(echo "$line" | jq .version)" = "$(value echelon_policy_version now.prom)" ]; then
    matched=1
    break
  fi
  sleep 0.3
done
check "scraped counts equal metrics.jsonl's line of that update" test "$matched" -eq 1
kill -INT "$LEARNER"
wait_exit "$LEARNER" 60
check "the run stops on SIGINT (exit 130)" test $? -eq 130
finish
