#!/usr/bin/env bash
# System test of `rl.staleness: auto` (sched/staleness_control.h) in a real run: one actor
# slowed 10x keeps the learner waiting, so with healthy data (ESS threshold 0) S climbs by one
# per window of 2 updates from 1 to its maximum 4 and no further. Checks: the `staleness`
# events of metrics.jsonl (1->2->3->4, at versions 2, 4, 6, each with its reason and the
# learning rate 3e-4 x 1 / S), every update line's staleness_bound equal to the S then in force
# and its staleness_max within it, `plan --from-run` fitting the run at its final S, a resumed
# run continuing at S = 4, and clear errors for bad settings.
#
#   bash tests/staleness_auto_test.sh ECHELON_BINARY
set -uo pipefail
ECHELON=$(realpath "${1:?usage: staleness_auto_test.sh ECHELON_BINARY}")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
source "$(dirname "$0")/lib.sh"
enter_workdir

COMMON=(warmstart.steps=10 task.eval_size=20 eval.every=0 rollout.transport=threads rollout.actors=1
        rollout.slow_actors=1 rollout.slowdown=10 rl.staleness=auto rl.staleness_start=1 rl.staleness_max=4
        rl.staleness_window=2 rl.staleness_ess_min=0 checkpoint.every=4)
timeout 300 "$ECHELON" train "$CONFIG" --out run rl.steps=10 "${COMMON[@]}" > train.out 2> train.err
check "the auto run exits 0" test $? -eq 0
check "progress names each change" grep -q '^staleness: S 3 -> 4 (learner busy .* < 0.950, ess_frac .*), lr 7.5e-05$' train.out

/usr/bin/python3 - run/metrics.jsonl > metrics.check 2>&1 <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
events = [l for l in lines if l.get("event") == "staleness"]
got = [(e["from"], e["to"], e["version"]) for e in events]
assert got == [(1, 2, 2), (2, 3, 4), (3, 4, 6)], got
for e in events:
    assert e["reason"].startswith("learner busy "), e
    assert abs(e["lr"] - 3e-4 / e["to"]) < 1e-12, e
s, n = 1, 0
for l in lines:
    if l.get("event") == "staleness":
        s = l["to"]
    elif "step" in l:
        n += 1
        assert l["staleness_bound"] == s, (l["step"], l["staleness_bound"], s)
        assert l["staleness_max"] <= s, (l["step"], l["staleness_max"], s)
        assert "is_ess_frac_by_staleness" in l and "masked_frac_by_staleness" in l, l["step"]
assert n == 10, n
print("ok")
PY
check "staleness events and bounds are consistent ($(tail -1 metrics.check))" grep -qx ok metrics.check

"$ECHELON" plan --from-run run > plan.out 2> plan.err
check "plan --from-run fits the auto run at its final S" grep -q "S = 4, kappa = 1" plan.out

timeout 300 "$ECHELON" train --resume run rl.steps=14 > resume.out 2> resume.err
check "the resumed auto run exits 0" test $? -eq 0
check "the resumed run continues at S = 4" grep -q '^step 14/14 .*(S=4)' resume.out
check "the resumed run changes S no more (at its maximum)" test "$(grep -c '"event":"staleness"' run/metrics.jsonl)" -eq 3

"$ECHELON" train "$CONFIG" --out bad1 rl.staleness=often > bad1.out 2> bad1.err
check "a bad rl.staleness is refused by name" grep -q "rl.staleness = 'often' is invalid; expected an integer in \[0, 1000\] or auto" bad1.err
"$ECHELON" train "$CONFIG" --out bad2 rl.staleness=auto rl.staleness_min=5 rl.staleness_start=2 > bad2.out 2> bad2.err
check "start below min is refused" grep -q "rl.staleness_min (5) <= rl.staleness_start (2) <= rl.staleness_max (64)" bad2.err
finish
