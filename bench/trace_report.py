"""Read a VKMULTI_TRACE file and show where a transfer's time goes.

    VKMULTI_TRACE=/tmp/t.csv python bench/cuda_peer.py ...   # any run of links
    python bench/trace_report.py /tmp/t.csv [--label cuda_peer] [--jobs 1]

For each link kind in the file: the jobs' end-to-end times (submit -> waited),
then the job of median duration event by event, in microseconds after its
submit. Poller events (src_done, dst_ready, ...) are the moments a timeline
semaphore was seen to reach a value; the rest are the worker's own marks.
"""
from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict


def jobs_of(rows: list[tuple[int, str, int]]) -> list[tuple[int, int, int, list[tuple[int, str, int]]]]:
    """(ticket, start, end, events) per job that has both a submit and a waited mark."""
    start: dict[int, int] = {}
    out = []
    for t, what, v in rows:
        if what == "submit":
            start[v] = t
        elif what == "waited" and v in start:
            t0 = start.pop(v)
            out.append((v, t0, t, [r for r in rows if t0 <= r[0] <= t]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--label", help="only this link kind (cuda_peer, host_shared, staging, exported)")
    ap.add_argument("--jobs", type=int, default=1, help="how many jobs around the median to print in full")
    a = ap.parse_args(argv)
    by_label: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    with open(a.file, newline="") as f:
        for label, t, what, v in csv.reader(f):
            if a.label in (None, label):
                by_label[label].append((int(t), what, int(v)))
    for label, rows in by_label.items():
        rows.sort()
        jobs = jobs_of(rows)
        if not jobs:
            print(f"{label}: no complete job")
            continue
        spans = sorted(jobs, key=lambda j: j[2] - j[1])
        us = [(j[2] - j[1]) / 1e3 for j in spans]
        print(f"{label}: {len(jobs)} jobs, submit->waited median {statistics.median(us):.1f} us, "
              f"min {us[0]:.1f}, max {us[-1]:.1f}")
        mid = len(spans) // 2
        for ticket, t0, t1, events in spans[max(0, mid - a.jobs // 2): mid - a.jobs // 2 + a.jobs]:
            print(f"  job {ticket}: {(t1 - t0) / 1e3:.1f} us")
            for t, what, v in events:
                print(f"    {(t - t0) / 1e3:9.1f}  {what:<16} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
