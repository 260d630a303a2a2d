#!/usr/bin/env python3
"""Where a broadcast spent its time, from a transfer trace.

Reads the JSON lines that `echelon broadcast origin --trace OUT.jsonl` (or
`broadcast_scale_bench --trace`) writes, one per transfer, and prints per sender: transfers,
megabytes sent, seconds its uplink was busy (some transfer of it between order and report),
the rate while busy, its first order and last report, and its idle gaps; then when each
receiver got its last chunk.

    bench/broadcast_trace_summary.py origin-trace.jsonl [--gap 0.15]

A sender's busy rate well under its link rate means its transfers were slow (for instance,
acknowledgements queued behind the receivers' own uploads); gaps mean it had nothing the
planner would send.
"""
import argparse
import collections
import json
import sys


def load(path):
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
                out.append((r["from"], r["to"], int(r["chunk"]), float(r["ordered_s"]), float(r["reported_s"]),
                            int(r["bytes"]), r["result"]))
            except (ValueError, KeyError, TypeError) as e:
                sys.exit("%s:%d: not a transfer record (%s)" % (path, n, e))
    if not out:
        sys.exit("%s: no transfers" % path)
    return out


def busy_and_gaps(intervals, min_gap):
    intervals = sorted(intervals)
    busy, gaps = 0.0, []
    start, end = intervals[0]
    for a, b in intervals[1:]:
        if a > end:
            busy += end - start
            if a - end > min_gap:
                gaps.append((end, a))
            start, end = a, b
        else:
            end = max(end, b)
    return busy + end - start, gaps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--gap", type=float, default=0.15, help="list idle gaps longer than this (s)")
    args = ap.parse_args()
    rs = load(args.trace)
    end = max(r[4] for r in rs)
    print("%d transfers, last report %.2f s after publishing" % (len(rs), end))
    print("%-12s %5s %9s %8s %10s %7s %7s  %s" % ("sender", "sent", "MB", "busy s", "Mbit/s busy", "first", "last",
                                                  "idle gaps (s)"))
    by_sender = collections.defaultdict(list)
    for r in rs:
        by_sender[r[0]].append(r)
    for s in sorted(by_sender, key=lambda k: (k != "origin", k)):
        t = by_sender[s]
        busy, gaps = busy_and_gaps([(r[3], r[4]) for r in t], args.gap)
        sent = sum(r[5] for r in t if r[6] == "verified")
        print("%-12s %5d %9.1f %8.2f %10.1f %7.2f %7.2f  %s" % (
            s, len(t), sent / 1e6, busy, sent * 8 / 1e6 / busy if busy > 0 else 0, min(r[3] for r in t),
            max(r[4] for r in t), " ".join("%.2f-%.2f" % g for g in gaps)))
    got = collections.defaultdict(set)
    last = {}
    for r in sorted(rs, key=lambda r: r[4]):
        if r[6] == "verified" and r[2] not in got[r[1]]:
            got[r[1]].add(r[2])
            last[r[1]] = r[4]
    print("last new chunk per receiver: " + " ".join("%s %.2f (%d)" % (k, last[k], len(got[k])) for k in sorted(last)))
    failed = sum(1 for r in rs if r[6] != "verified")
    if failed:
        print("%d transfers failed or were corrupt" % failed)


if __name__ == "__main__":
    main()
