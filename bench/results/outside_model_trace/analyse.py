"""Median time between consecutive trace points of one group's round trip (round_trip.py's stamps, in
/tmp/trace/PID files): `python analyse.py [skip]`."""

from __future__ import annotations

import collections
import glob
import sys

import numpy as np

skip = int(sys.argv[1]) if len(sys.argv) > 1 else 50
events = []
for path in glob.glob("/tmp/trace/*"):
    for line in open(path):
        tag, t = line.split()
        events.append((float(t), tag))
events.sort()
groups, current = [], None
for t, tag in events:
    if tag == "C0":
        current = [(t, tag)]
        groups.append(current)
    elif current is not None:
        current.append((t, tag))
groups = groups[skip:]
shapes = collections.Counter(tuple(tag for _, tag in g) for g in groups)
common = shapes.most_common(1)[0][0]
gaps = np.array([np.diff([t for t, _ in g]) for g in groups if tuple(tag for _, tag in g) == common]) * 1e3
print(f"{len(gaps)} of {len(groups)} groups in the most common order of events")
for i in range(len(common) - 1):
    print(f"{common[i]:>10} -> {common[i + 1]:<10} {np.median(gaps[:, i]):.3f} ms")
print(f"sum of the medians {np.median(gaps, axis=0).sum():.3f} ms; median of the sums {np.median(gaps.sum(axis=1)):.3f} ms")
