"""What every run's metrics.jsonl must satisfy, whatever happened to it (crashes, resumes,
evictions, an attacker). Used by the system tests and bench/chaos.sh.

  /usr/bin/python3 tests/run_invariants.py RUN/metrics.jsonl --staleness S \
      [--steps N --batch B] [--end final|interrupted] [--resumes K --discarded RUN/metrics.discarded.jsonl]

Checks: every step exactly once and in order (0, 1, ...), version = step + 1, no group
consumed twice, staleness_max <= S on every line, and on every line that carries the counts
groups_issued = consumed + dropped_stale + filtered + reissued + in_flight; optionally the step and group
totals, the last line's event and the number of resume events (kept, or set aside by a resume
that cut the history back). Prints "ok ..." with the totals, or one "FAIL: ..." per violation
and "not ok"; exits 0 or 1.
"""
import argparse
import json
import sys

p = argparse.ArgumentParser()
p.add_argument("metrics")
p.add_argument("--staleness", type=int, required=True)
p.add_argument("--steps", type=int)
p.add_argument("--batch", type=int)
p.add_argument("--end", choices=["final", "interrupted"])
p.add_argument("--resumes", type=int)
p.add_argument("--discarded")
a = p.parse_args()

lines = [json.loads(l) for l in open(a.metrics)]
discarded = []
if a.discarded:
    for l in open(a.discarded):
        try:
            discarded.append(json.loads(l))
        except ValueError:  # a line cut mid-write
            pass
train = [l for l in lines if "step" in l]
ok = True


def need(cond, what):
    global ok
    if not cond:
        ok = False
        print("FAIL:", what)


need([l["step"] for l in train] == list(range(len(train))), "every step exactly once, in order: %s" % [l["step"] for l in train])
need(all(l["version"] == l["step"] + 1 for l in train), "version = step + 1 on every line")
groups = [g for l in train for g in l["consumed_groups"]]
need(len(set(groups)) == len(groups), "a group consumed twice")
need(all(l["staleness_max"] <= a.staleness for l in train), "staleness above S: %s" % [l["staleness_max"] for l in train])
for l in lines:
    if "groups_issued" in l:
        need(l["groups_issued"] == l["groups_consumed"] + l["groups_dropped_stale"] + l.get("groups_filtered", 0) +
             l["groups_reissued"] + l["groups_in_flight"],
             "counts do not add up: %s" % {k: l.get(k) for k in ("step", "event", "groups_issued", "groups_consumed",
                                                                   "groups_dropped_stale", "groups_filtered", "groups_reissued",
                                                                   "groups_in_flight")})
if a.steps is not None:
    need(len(train) == a.steps, "%d steps, expected %d" % (len(train), a.steps))
if a.steps is not None and a.batch is not None:
    need(len(groups) == a.steps * a.batch, "consumed %d groups, expected %d" % (len(groups), a.steps * a.batch))
    need(lines[-1].get("groups_consumed") == a.steps * a.batch, "final consumed count")
if a.end:
    need(lines[-1].get("event") == a.end, "the last line is the %s line" % a.end)
resumes = [l for l in lines + discarded if l.get("event") == "resume"]
if a.resumes is not None:
    need(len(resumes) == a.resumes, "%d resume events kept or set aside, got %d" % (a.resumes, len(resumes)))
print("%s: %d steps, %d groups consumed, %d resumes" % ("ok" if ok else "not ok", len(train), len(groups), len(resumes)))
sys.exit(0 if ok else 1)
