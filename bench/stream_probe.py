"""Where an append waits: times three light round trips through a running nats-server.

Why: in ``make bench-live``'s 500/s phase with fsync on every write, intake's answer (its
submission appended to WORKLOADS) takes several times a bare fsync. This process, started
by ``python bench/bench_live.py --side-probe`` during each latency phase (or by hand
against any server), sends every ``--every-s`` one of each, in turn, and times it:

* ``own stream``: a JetStream append to a stream of its own (``PROBE_SIDE``, created
  here): the fsync and nats-server's work, without WORKLOADS' one writer;
* ``core request``: a core-NATS request to a responder in this process: two hops through
  nats-server, nothing stored;
* ``WORKLOADS``: an append to WORKLOADS itself, on an event subject no reader knows
  (``allot.v1.events.zzprobe.<n>.probe``: every log reader skips it with a warning), so
  it queues behind the stack's own appends.

Run: ``python bench/stream_probe.py NATS_URL SECONDS``; prints p50 / p90 / p99 of each.
A diagnostic: it writes to the log of the stack it probes, so never against a real one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import nats
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig

from allot.proto import subjects as s
from report_bursts import percentile  # a sibling script (sys.path[0])

PROBE_STREAM = "PROBE_SIDE"
PROBE_SUBJECT = "probe-side.append"
REQUEST_SUBJECT = "probe-side.request"


def _percentiles(seconds: list[float]) -> str:
    if not seconds:
        return "no samples"
    at = [percentile(seconds, q) * 1000 for q in (0.5, 0.9, 0.99)]
    return f"n {len(seconds)}, p50 {at[0]:.2f} ms, p90 {at[1]:.2f} ms, p99 {at[2]:.2f} ms"


def workloads_subject(n: int) -> str:
    """The probe's ``n``-th WORKLOADS append: an event name no reader knows."""
    return f"{s.PREFIX}.events.zzprobe.p{n}.probe"


async def probe(url: str, seconds: float, every_s: float) -> dict[str, list[float]]:
    nc = await nats.connect(url)
    requester = await nats.connect(url)  # a request crosses nats-server, not this socket
    js = nc.jetstream()
    try:
        await js.add_stream(
            StreamConfig(name=PROBE_STREAM, subjects=[PROBE_SUBJECT], storage=StorageType.FILE)
        )

        async def respond(msg: Msg) -> None:
            await msg.respond(b"ok")

        await nc.subscribe(REQUEST_SUBJECT, cb=respond)
        trips: dict[str, Callable[[int], Awaitable[object]]] = {
            "own stream": lambda _: js.publish(PROBE_SUBJECT, b"x" * 200),
            "core request": lambda _: requester.request(REQUEST_SUBJECT, b"x", timeout=10),
            "WORKLOADS": lambda n: js.publish(workloads_subject(n), b"{}"),
        }
        times: dict[str, list[float]] = {name: [] for name in trips}
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += 1
            for name, trip in trips.items():
                t = time.perf_counter()
                await trip(n)
                times[name].append(time.perf_counter() - t)
            await asyncio.sleep(every_s)
        return times
    finally:
        with contextlib.suppress(Exception):  # a failed run leaves no stream behind either
            await js.delete_stream(PROBE_STREAM)
        await requester.close()
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nats_url")
    ap.add_argument("seconds", type=float)
    ap.add_argument("--every-s", type=float, default=0.02)
    args = ap.parse_args(argv)
    times = asyncio.run(probe(args.nats_url, args.seconds, args.every_s))
    for name, seconds in times.items():
        print(f"side probe, {name}: {_percentiles(seconds)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
