"""Do a latency phase's slow probes follow the commits of the agents' reports?

Why: dispatch appends the agents' run reports (starts and ends) as atomic batches that
linger 250 ms (``allot.services.dispatch.REPORT_BATCH_LINGER_S``), so at 500 probes/s a
few hundred records land in WORKLOADS at once, four times a second. While nats-server
stores such a batch, intake's and placement's appends wait behind it on the stream; then
every reader of the log (placement, dispatch, accounting, the load generator) takes the
burst, on the 2 cores the whole stack shares. This script tells how much of the tail that
explains, from a timeline written by ``python bench/bench_live.py --timeline PATH``:

* a *burst* is a run of report records seen within ``--gap-ms`` of each other, at least
  ``--min-records`` of them (one commit);
* each probe gets the offset of its send time from the first record of the nearest burst
  (negative: sent before the burst was seen);
* printed: the mean submit -> placed latency and intake's answer by 10 ms offset, the
  latency percentiles near bursts and away from them, and where and when the slowest 1%
  were sent (what it found: docs/decisions/0015).

Run: ``python bench/report_bursts.py PATH.500.json``; prints only.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path

NEAR_MS = (-20.0, 60.0)
"""Offsets (send time minus the burst's first record seen) of a probe *near* a burst: from
20 ms before it to 60 ms after (where the mean latency was raised: docs/decisions/0015)."""


def bursts(seen: list[float], gap_s: float, min_records: int) -> list[float]:
    """First-seen times of the runs of records no more than ``gap_s`` apart, of at least
    ``min_records`` records."""
    out: list[float] = []
    start, last, n = None, None, 0
    for t in sorted(seen):
        if last is not None and t - last <= gap_s:
            last, n = t, n + 1
            continue
        if start is not None and n >= min_records:
            out.append(start)
        start, last, n = t, t, 1
    if start is not None and n >= min_records:
        out.append(start)
    return out


def offset_s(sent: float, starts: list[float]) -> float | None:
    """``sent`` minus the nearest burst start (None without bursts)."""
    i = bisect.bisect_left(starts, sent)
    near = [starts[j] for j in (i - 1, i) if 0 <= j < len(starts)]
    if not near:
        return None
    return min((sent - s for s in near), key=abs)


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def report(timeline: dict[str, object], gap_s: float, min_records: int) -> str:
    probes = timeline["probes"]
    seen = timeline["reports_seen"]
    assert isinstance(probes, list) and isinstance(seen, list)
    starts = bursts([float(t) for t in seen], gap_s, min_records)
    span = max(p[0] for p in probes) - min(p[0] for p in probes)
    lines = [
        f"{len(probes)} probes at {timeline['rate']}/s; {len(seen)} report records seen, "
        f"{len(starts)} bursts of >= {min_records} ({len(starts) / span:.1f} a second)"
    ]
    by_bin: dict[int, list[tuple[float, float]]] = defaultdict(list)
    near: list[float] = []
    away: list[float] = []
    offsets: list[tuple[float, float]] = []  # (latency, offset ms)
    for sent, latency, answer in probes:
        off = offset_s(sent, starts)
        if off is None:
            continue
        ms = off * 1e3
        offsets.append((latency, ms))
        by_bin[round(ms / 10)].append((latency, answer))
        (near if NEAR_MS[0] <= ms <= NEAR_MS[1] else away).append(latency)
    lines.append("offset from the burst (ms; + = sent after it was seen): mean latency / answer")
    for b in sorted(k for k in by_bin if -8 <= k <= 12):
        rows = by_bin[b]
        lat = statistics.fmean(r[0] for r in rows) * 1e3
        ans = statistics.fmean(r[1] for r in rows) * 1e3
        lines.append(f"  {b * 10:+5d}  {lat:6.1f} / {ans:5.1f} ms  ({len(rows)} probes)")
    for name, xs in (("near a burst", near), ("away from bursts", away)):
        if xs:
            lines.append(
                f"{name}: {len(xs)} probes ({100 * len(xs) / len(offsets):.0f}%), "
                f"p50 {percentile(xs, 0.5) * 1e3:.1f} ms, p99 {percentile(xs, 0.99) * 1e3:.1f} ms"
            )
    slowest = sorted(offsets, reverse=True)[: max(1, len(offsets) // 100)]
    in_window = sum(1 for _, ms in slowest if NEAR_MS[0] <= ms <= NEAR_MS[1])
    lines.append(
        f"the slowest 1% ({len(slowest)} probes, >= {slowest[-1][0] * 1e3:.1f} ms): "
        f"{in_window} sent near a burst (from {-NEAR_MS[0]:.0f} ms before one to "
        f"{NEAR_MS[1]:.0f} ms after)"
    )
    # Whether the tail is spread over the phase or is one episode of a few hundred ms.
    t0 = min(p[0] for p in probes)
    by_second = Counter(int(p[0] - t0) for p in sorted(probes, key=lambda p: -p[1])[: len(slowest)])
    lines.append(
        "the slowest 1% by second of the phase they were sent in: "
        + ", ".join(f"{s}: {n}" for s, n in sorted(by_second.items()))
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("timeline", type=Path, help="a file written by bench_live.py --timeline")
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--min-records", type=int, default=20)
    args = ap.parse_args(argv)
    timeline = json.loads(args.timeline.read_text())
    print(report(timeline, args.gap_ms / 1e3, args.min_records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
