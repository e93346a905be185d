"""Live-system benchmark (``make bench-live``): the whole stack on this machine.

Setup: ``allot.ops.stack.Stack`` with ONE fake agent process simulating 1,000 hosts x 8
GPUs (its hosts' reports sent in batches, ``--batch-reports``), one intake, one placement,
health, dispatch, ranking, accounting, on the embedded (or given) NATS and Redis. Then,
from this process over plain NATS requests:

0. fill 500 hosts with protected allocated work (8-GPU runs of ``search``, 8 h minimum
   runtime), so 4,000 GPUs stay free: enough that a probe below never waits for a GPU (at
   500/s, runs of 1 s hold ~500 GPUs, more while the stack lags), so its latency is the
   decision path's, not the cluster's capacity (with 900 filled and 800 free, a lagging
   stack ran out of GPUs and the figure measured that: docs/decisions/0024);
1. **throughput**: 10,000 submissions of 4,008-GPU runs (one host more than the free GPUs)
   for ``search``, the team already far
   over its entitlement (they can never fit in the free GPUs, and over-entitlement work
   may preempt only worse-ranked over-entitlement work: there is none, so they all stay
   pending), 64 requests in flight; figure: accepted submissions per second (goal >=
   2,000). Why not a team under its entitlement: its blocked giant gang would *earmark*
   the free GPUs (the core's rule that keeps room for an owed request), and the 1-GPU
   probes below could not be placed at all; that is the policy, not a speed limit;
2. **latency** with those 10,000 pending: 1-GPU ``nlp`` submissions paced at 500/s for
   ``--probe-s`` seconds (fake runs of 1 s, so they recycle the free GPUs); figure: time
   from sending the submit request to receiving the ``WorkloadPlaced`` record, in an HDR
   histogram (goal p50 <= 5 ms, p99 <= 50 ms).

3. **batch throughput**: the same 10,000 kind of submissions again, sent as ``SubmitBatch``
   requests of ``--batch`` (100) workloads, 4 requests in flight (as Armada's job-set
   submit or a Slurm job array); figure: accepted workloads per second. Measured last,
   because these stay pending too.

Each latency phase also reports the CPU each process used while its probes were being
sent (``/proc``), per probe, what happened after each decision (placed -> its run started on
the agent, its run's end -> the completion in the log: how far behind the rest of the
stack ran), and waits until every probe's run has ended before the next.

Results are printed and written to ``bench/results/live.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import nats
from hdrh.histogram import HdrHistogram

from allot.adapters.embedded import unwind_on_sigterm
from allot.ops.stack import AgentSpec, Stack, StackConfig
from allot.proto import messages as m
from allot.proto import subjects as s
from bench_cycle import machine_reference_s  # a sibling script (sys.path[0])

RESULTS = Path(__file__).resolve().parent / "results"
GOAL_RATE = 2000.0
GOAL_P50_MS = 5.0
GOAL_P99_MS = 50.0
GOAL_STACK_CPU_MS = 1.5
"""Issue 38: CPU per probe summed over the stack's processes (not the load generator)."""
LOAD_GENERATOR = "load generator"
BATCHES_IN_FLIGHT = 4
IDLE_S = 10.0
OFF_PATH = ("dispatch", "accounting", "agent-bench", "health", "ranking")
"""Processes not between a submission and its placement decision (``--pause-off-path``)."""
RUNS_NEED = ("dispatch", "agent-bench")
"""Without either, no placed run starts or ends (dispatch hands work to the agent)."""


def _paused_names(text: str) -> tuple[str, ...]:
    """``--pause``'s value: comma-separated names from ``OFF_PATH``."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in OFF_PATH]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"names must be among {','.join(OFF_PATH)}, got {text!r}")
    return names


PROBE_TIMEOUT_S = 30.0
"""A probe unanswered this long is counted at this latency (saturation)."""


def _cpu_seconds(pids: dict[str, int], *, kernel_only: bool = False) -> dict[str, float]:
    """CPU seconds (user + system, or system alone) each process has used so far, from
    ``/proc`` (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone, or not Linux
        system = int(fields[12])  # stime; utime is fields[11]
        out[name] = (system if kernel_only else int(fields[11]) + system) / tick
    return out


def fsync_reference_ms(directory: Path, writes: int = 200) -> tuple[float, float]:
    """(p50, p90) ms of a 4 KiB write + ``fsync`` in ``directory`` (where nats-server
    stores the log): how fast this VM's disk is right now. With fsync on every write, two
    of them are on a submission's way to its placement (intake's append, placement's), and
    this disk's speed drifts as much as its CPU's (the loop figure says nothing of it)."""
    times: list[float] = []
    path = directory / "fsync-reference"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        block = os.urandom(4096)
        for i in range(writes):
            t0 = time.perf_counter()
            os.pwrite(fd, block, i * 4096)
            os.fsync(fd)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    times.sort()
    return round(times[len(times) // 2], 2), round(times[len(times) * 9 // 10], 2)


def _cpu_ticks() -> tuple[int, int]:
    """(all, steal) jiffies of every CPU so far, from ``/proc/stat`` ((0, 0) elsewhere)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(fields[:8]), fields[7] if len(fields) > 7 else 0


def _wakeups(pids: dict[str, int]) -> dict[str, float]:
    """Times each process has gone to sleep waiting and been woken so far (voluntary
    context switches summed over its threads, from ``/proc``; Linux): a record handed over
    alone costs its reader several times one taken in a batch (docs/benchmarks.md)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        total = 0
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):  # a thread that ended meanwhile
                    for line in (task / "status").read_text().splitlines():
                        if line.startswith("voluntary_ctxt_switches:"):
                            total += int(line.split()[1])
        except OSError:
            continue  # gone, or not Linux
        out[name] = float(total)
    return out


def _by_process(
    used: dict[str, float], probes: int, *, scale: float = 1000.0, digits: int = 3
) -> dict[str, float]:
    """Each process's use per probe times ``scale`` (CPU seconds -> ms by default), largest
    first."""
    return {
        n: round(u * scale / probes, digits) for n, u in sorted(used.items(), key=lambda x: -x[1])
    }


def _listed(figures: dict[str, Any]) -> str:
    """``name figure`` pairs for a report row: ``nats-server 0.7, intake 0.4``."""
    return ", ".join(f"{n} {v}" for n, v in figures.items())


def _growth(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each process added between two readings (``_cpu_seconds``, ``_wakeups``)."""
    return {n: after[n] - before[n] for n in after if n in before}


def _stack_per_probe(
    used: dict[str, float], probes: int, gone: list[str], *, scale: float = 1000.0
) -> float | None:
    """What the stack's processes (every one but the load generator) used per probe, summed
    and times ``scale`` (CPU seconds -> ms by default); None when a process of the stack
    ended meanwhile (its share is unknown, and leaving it out would understate the sum) or
    nothing was measured."""
    if gone or not used or not probes:
        return None
    return round(sum(u for n, u in used.items() if n != LOAD_GENERATOR) * scale / probes, 3)


Connz = dict[int, tuple[str, int, int]]
"""nats-server's connections by id: (name, messages in, messages out)."""


def _connz(monitor_url: str | None) -> Connz:
    """Messages in and out of nats-server per connection (its ``/connz``); empty without a
    monitoring URL (a server the benchmark did not start)."""
    if monitor_url is None:
        return {}
    with urllib.request.urlopen(f"{monitor_url}/connz?limit=1024", timeout=5) as answer:
        data = json.load(answer)
    return {
        int(c["cid"]): (str(c.get("name") or c["cid"]), int(c["in_msgs"]), int(c["out_msgs"]))
        for c in data.get("connections", [])
    }


def _messages_per_probe(before: Connz, after: Connz, probes: int) -> dict[str, Any] | None:
    """What nats-server took in and sent out per probe while the probes were sent, in all
    and sent out by connection name (a message delivered to several readers counts once
    each). Connections are matched by id: one made since (a reconnect) counts from zero,
    and several of one name add up."""
    if not after or not probes:
        return None
    moved: dict[str, tuple[int, int]] = {}
    for cid, (name, n_in, n_out) in after.items():
        _, in_before, out_before = before.get(cid, (name, 0, 0))
        had_in, had_out = moved.get(name, (0, 0))
        moved[name] = (had_in + n_in - in_before, had_out + n_out - out_before)
    out = {n: round(o / probes, 2) for n, (_, o) in sorted(moved.items(), key=lambda x: -x[1][1])}
    in_ = {n: round(i / probes, 2) for n, (i, _) in sorted(moved.items(), key=lambda x: -x[1][0])}
    return {
        "in": round(sum(i for i, _ in moved.values()) / probes, 2),
        "out": round(sum(o for _, o in moved.values()) / probes, 2),
        "out_by_connection": {n: v for n, v in out.items() if v >= 0.01},
        "in_by_connection": {n: v for n, v in in_.items() if v >= 0.01},
    }


def _body(client_id: str, alloc: str, gpus: int, min_runtime_s: int, duration_s: float) -> bytes:
    return json.dumps(
        {
            "type": "SubmitWorkload",
            "client_id": client_id,
            "user": "bench",
            "gpus": gpus,
            "allocation": alloc,
            "min_runtime_s": min_runtime_s,
            "duration_s": duration_s,
        }
    ).encode()


async def _submit_many(
    nc: nats.NATS, bodies: list[tuple[str, bytes]], in_flight: int
) -> tuple[int, int, float]:
    """Send ``bodies`` as requests, ``in_flight`` at a time: each answer sends the next.
    Answers come to one inbox subscription, without nats-py's per-request future, timer and
    task (the load generator shares the 2 cores with the stack it measures)."""
    inbox = nc.new_inbox()
    counts = [0, 0]  # accepted, rejected
    todo = iter(enumerate(bodies))
    done = asyncio.Event()

    async def send_next() -> None:
        nxt = next(todo, None)
        if nxt is not None:
            i, (subject, body) = nxt
            await nc.publish(subject, body, reply=f"{inbox}.{i}")

    async def on_answer(msg: Any) -> None:
        counts[b'"WorkloadAccepted"' not in msg.data] += 1
        if sum(counts) == len(bodies):
            done.set()
        else:
            await send_next()

    answers = await nc.subscribe(f"{inbox}.*", cb=on_answer)
    t0 = time.perf_counter()
    for _ in range(min(in_flight, len(bodies))):
        await send_next()
    try:
        await asyncio.wait_for(done.wait(), timeout=30 + len(bodies) / 100)
    except TimeoutError:
        raise TimeoutError(f"bench: {len(bodies) - sum(counts)} submissions unanswered") from None
    finally:
        await answers.unsubscribe()
    return counts[0], counts[1], time.perf_counter() - t0


async def _submit_batches(
    nc: nats.NATS, n: int, size: int, in_flight: int, gpus: int
) -> dict[str, Any]:
    """``n`` pending-forever runs of ``gpus`` for ``search`` in ``SubmitBatch`` requests of
    ``size``."""
    items = [_body(f"batch-{i}", "search", gpus, 3600, 3600.0) for i in range(n)]
    bodies = [
        b'{"type":"SubmitBatch","workloads":[' + b",".join(items[i : i + size]) + b"]}"
        for i in range(0, n, size)
    ]
    sem = asyncio.Semaphore(in_flight)
    accepted = 0

    async def one(body: bytes) -> None:
        nonlocal accepted
        async with sem:
            reply = await nc.request(s.submit("search"), body, timeout=60)
        results = json.loads(reply.data)["results"]
        accepted += sum(r["type"] == "WorkloadAccepted" for r in results)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(b) for b in bodies))
    elapsed = time.perf_counter() - t0
    rate = accepted / elapsed
    return {
        "submissions": n,
        "batch_size": size,
        "in_flight": in_flight,
        "accepted": accepted,
        "seconds": round(elapsed, 3),
        "accepted_per_s": round(rate, 1),
        "goal_per_s": GOAL_RATE,
        "pass": rate >= GOAL_RATE,
    }


async def _queued_at_least(nc: nats.NATS, n: int, timeout: float) -> int:
    """Poll the leader's queue until it holds ``n`` workloads; returns how many it holds."""
    deadline = time.monotonic() + timeout
    while True:
        reply = await nc.request(s.QUERY_QUEUE, b"{}", timeout=60)
        queued = int(json.loads(reply.data)["total"])
        if queued >= n:
            return queued
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: placement queued {queued} of {n} in {timeout:.0f} s")
        await asyncio.sleep(0.5)


def _p50_ms(seconds: list[float]) -> float | None:
    return round(statistics.median(seconds) * 1000, 1) if seconds else None


SEGMENTS = ("sent -> intake", "intake -> deciding cycle", "deciding cycle -> placed seen")


def _segments(
    sent_wall: dict[str, float],
    wid_of: dict[str, str],
    intake_at: dict[str, float],
    placed_raw: dict[str, bytes],
    placed_wall: dict[str, float],
) -> dict[str, list[float]]:
    """p50 and p99 (ms) of each leg of a probe's submit -> placed, by wall clock: sent ->
    intake took the request (``WorkloadAccepted.at``, the same as its ``WorkloadSubmitted``'s)
    -> the placement cycle that placed it
    began (``WorkloadPlaced.at``) -> its record was seen here. The second leg holds the
    fsynced append, its delivery to placement and any wait for the previous cycle's
    decisions to come back from the log."""
    legs: dict[str, list[float]] = {name: [] for name in SEGMENTS}
    for cid, wid in wid_of.items():
        if wid not in intake_at or wid not in placed_raw:
            continue
        took_at = intake_at[wid]
        cycle_at = json.loads(placed_raw[wid])["at"]
        for name, dt in zip(
            SEGMENTS,
            (took_at - sent_wall[cid], cycle_at - took_at, placed_wall[wid] - cycle_at),
            strict=True,
        ):
            legs[name].append(dt)
    out: dict[str, list[float]] = {}
    for name, xs in legs.items():
        if xs:
            xs.sort()
            out[name] = [round(xs[len(xs) // 2] * 1e3, 2), round(xs[int(len(xs) * 0.99)] * 1e3, 2)]
    return out


def _free_gpus(args: argparse.Namespace) -> int:
    """GPUs left free by the fill (8 per host)."""
    return (args.hosts - args.fill_hosts) * 8


def _never_fits(args: argparse.Namespace) -> int:
    """GPUs of a pending run that can never fit: one host more than the free GPUs."""
    return _free_gpus(args) + 8


async def _count_placed(nc: nats.NATS, subject: str) -> tuple[list[int], Any]:
    count = [0]

    async def cb(msg: Any) -> None:
        count[0] += 1

    sub = await nc.subscribe(subject, cb=cb)
    return count, sub


async def _wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: {what} not reached in {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def run_bench(
    nats_url: str,
    args: argparse.Namespace,
    pids: dict[str, int] | None = None,
    monitor_url: str | None = None,
) -> dict[str, Any]:
    nc = await nats.connect(nats_url, pending_size=256 * 1024 * 1024, name="bench-load-generator")
    try:
        # 0. fill --fill-hosts hosts with protected work
        filled, fill_sub = await _count_placed(nc, f"{s.PREFIX}.events.search.*.placed")
        fill = [
            (s.submit("search"), _body(f"fill-{i}", "search", 8, 8 * 3600, 7200.0))
            for i in range(args.fill_hosts)
        ]
        await _submit_many(nc, fill, 64)
        await _wait(lambda: filled[0] >= args.fill_hosts, 120, "fill placed")
        await fill_sub.unsubscribe()

        # 1. throughput: runs that stay pending (one host more than the free GPUs)
        print("phase: throughput", flush=True)
        big = _never_fits(args)
        pending = [
            (s.submit("search"), _body(f"big-{i}", "search", big, 3600, 3600.0))
            for i in range(args.pending)
        ]
        accepted, rejected, elapsed = await _submit_many(nc, pending, args.in_flight)
        rate = accepted / elapsed

        # let placement fold them all (its queue holds them before we measure latency: the
        # goal is stated with 10,000 pending, and a fold still catching up would be timed)
        queued = await _queued_at_least(nc, accepted, timeout=300)

        # the stack's own cost with nothing submitted: heartbeats, accrual, timers
        idle = await _idle_cpu(pids or {}, IDLE_S)

        # 2. latency at paced rates with that queue pending (the first rate is the goal's)
        phases = [
            await _latency_phase(
                nc, rate, args, queued, pids or {}, nats_url=nats_url, monitor_url=monitor_url
            )
            for rate in args.rates
        ]

        # 3. the same kind of submissions, SubmitBatch of --batch each (after the latency
        # phases: these too stay pending, and the latency goal is stated at 10,000 pending)
        print("phase: batch throughput", flush=True)
        batch = await _submit_batches(nc, args.pending, args.batch, BATCHES_IN_FLIGHT, big)
        return {
            "hosts": args.hosts,
            "gpus_per_host": 8,
            "fill_hosts": args.fill_hosts,
            "free_gpus": _free_gpus(args),
            "pending_gpus": big,
            "throughput": {
                "submissions": len(pending),
                "accepted": accepted,
                "rejected": rejected,
                "seconds": round(elapsed, 3),
                "accepted_per_s": round(rate, 1),
                "in_flight": args.in_flight,
                "goal_per_s": GOAL_RATE,
                "pass": rate >= GOAL_RATE,
            },
            "idle": idle,
            "latency": phases,
            "batch_throughput": batch,
        }
    finally:
        await nc.close()


async def _idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, Any]:
    """CPU each process uses over ``seconds`` with nothing submitted (cores)."""
    print(f"phase: idle {seconds:.0f} s", flush=True)
    before = _cpu_seconds(pids)
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - t0
    after = _cpu_seconds(pids)
    cores = {n: used / elapsed for n, used in _growth(before, after).items()}
    return {
        "seconds": round(elapsed, 1),
        "cpu_cores": round(sum(cores.values()), 2),
        "cores": {n: round(c, 3) for n, c in sorted(cores.items(), key=lambda x: -x[1])},
    }


async def _start_side_probe(
    args: argparse.Namespace, nats_url: str
) -> asyncio.subprocess.Process | None:
    """``--side-probe``: ``bench/stream_probe.py`` timing light appends and requests beside
    the probes, for as long as they are sent (a diagnostic; its lines are printed only)."""
    if not args.side_probe:
        return None
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).resolve().parent / "stream_probe.py"),
        nats_url,
        str(args.probe_s),
        stdout=asyncio.subprocess.PIPE,
    )


async def _latency_phase(
    nc: nats.NATS,
    rate: float,
    args: argparse.Namespace,
    queued: int,
    pids: dict[str, int],
    *,
    nats_url: str,
    monitor_url: str | None = None,
) -> dict[str, Any]:
    """Submit 1-GPU ``nlp`` probes paced at ``rate``/s; time each from sending the request
    to receiving its ``WorkloadPlaced`` record."""
    hist = HdrHistogram(1, 60_000_000, 3)  # microseconds, 1 us .. 60 s
    sent: dict[str, float] = {}
    wid_of: dict[str, str] = {}
    placed_at: dict[str, float] = {}
    acked: dict[str, float] = {}  # the intake's answer: the submission is in the log

    ended: set[str] = set()
    # After the decision, from the records' own times (the agent's clock, this machine's):
    # placed (seen here) -> run started on its host; run ended -> completion seen here.
    placed_wall: dict[str, float] = {}
    reports_seen: list[float] = []  # when each run's start or end was seen (--timeline)
    to_start: list[float] = []
    to_logged_end: list[float] = []
    # Probes placed and not yet ended, and the most at once: when that reaches the free
    # GPUs, a probe waits for one to end, and its latency is the cluster's capacity, not
    # the decision path (the free GPUs are set by --fill-hosts; the runs last 1 s).
    running = [0, 0]
    # Where the time goes, from the records' own times (``at``: intake's clock when the
    # request arrived; placement's when the deciding cycle began), decoded after the phase
    sent_wall: dict[str, float] = {}
    intake_at: dict[str, float] = {}
    placed_raw: dict[str, bytes] = {}

    # Only the events it times: the subject names each (not the submissions: intake's
    # answer carries their time), so the server filters the rest out.
    async def on_event(msg: Any) -> None:
        _, _, _, _, wid, event = msg.subject.split(".")
        if event == "placed":
            placed_raw.setdefault(wid, msg.data)
            if wid not in placed_at:
                placed_at[wid] = time.perf_counter()
                placed_wall[wid] = time.time()
                running[0] += 1
                running[1] = max(running)
        elif event == "started":
            reports_seen.append(time.time())
            if wid in placed_wall:
                to_start.append(json.loads(msg.data)["at"] - placed_wall[wid])
        elif event == "completed":
            reports_seen.append(time.time())
            ended.add(wid)
            running[0] -= 1
            to_logged_end.append(time.time() - json.loads(msg.data)["at"])

    subs = [
        await nc.subscribe(f"{s.PREFIX}.events.nlp.*.{event}", cb=on_event)
        for event in ("placed", "started", "completed")
    ]
    print(f"phase: latency at {rate:.0f}/s", flush=True)
    total = int(rate * args.probe_s)
    interval = 1.0 / rate

    # Requests without nats-py's per-request future, timer and task: each probe's answer
    # comes to its own reply subject under one inbox subscription. The load generator
    # shares the 2 cores with the stack, so what it spends is taken from what is measured.
    inbox = nc.new_inbox()

    async def on_answer(msg: Any) -> None:
        cid = msg.subject.rsplit(".", 1)[1]
        acked[cid] = time.perf_counter()
        data = json.loads(msg.data)
        if data.get("type") == "WorkloadAccepted":
            wid_of[cid] = data["workload_id"]
            intake_at[data["workload_id"]] = data["at"]

    answers = await nc.subscribe(f"{inbox}.*", cb=on_answer)

    # --pause-off-path: what the decision path alone (load generator, intake, nats-server,
    # placement) does at this rate, with the processes off it stopped while probes are sent;
    # --pause: some of them only, to see which weighs
    paused = [pid for name, pid in pids.items() if name in args.pause]
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    side = await _start_side_probe(args, nats_url)
    leader_before = await _placement_stats(nc)
    connz_before = await asyncio.to_thread(_connz, monitor_url)
    cpu_before = _cpu_seconds(pids)
    kernel_before = _cpu_seconds(pids, kernel_only=True)
    wakeups_before = _wakeups(pids)
    start = time.perf_counter()
    for i in range(total):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        cid = f"probe-{int(rate)}-{i}"
        sent[cid] = time.perf_counter()
        sent_wall[cid] = time.time()
        await nc.publish(s.submit("nlp"), _body(cid, "nlp", 1, 60, 1.0), reply=f"{inbox}.{cid}")
    sending_s = time.perf_counter() - start
    cpu_after = _cpu_seconds(pids)
    kernel_after = _cpu_seconds(pids, kernel_only=True)
    wakeups_after = _wakeups(pids)
    connz_after = await asyncio.to_thread(_connz, monitor_url)
    leader_after = await _placement_stats(nc)
    if side is not None:
        out, _ = await side.communicate()
        print(out.decode().rstrip(), flush=True)
    with contextlib.suppress(TimeoutError):  # saturated: some got no answer in time
        await _wait(lambda: len(acked) == total, PROBE_TIMEOUT_S, "probes answered")
    await answers.unsubscribe()
    # Counted at the timeout, a lower bound.
    timed_out = [cid for cid in sent if cid not in acked]
    achieved = total / ((max(acked.values()) if acked else time.perf_counter()) - start)
    # CPU while the probes were being sent: per process, per probe sent
    cpu = _growth(cpu_before, cpu_after)
    kernel = _growth(kernel_before, kernel_after)
    wakeups = _growth(wakeups_before, wakeups_after)
    gone = sorted(set(cpu_before) - set(cpu_after))  # processes that ended while sending
    # (Probes that timed out may still be accepted and placed later: wait for the answered.)
    await _wait(lambda: all(w in placed_at for w in wid_of.values()), 120, "probes placed")
    for pid in paused:
        os.kill(pid, signal.SIGCONT)
    # The next phase starts on a quiet stack: every probe's run has ended and been logged
    # (otherwise its CPU and latency would carry this phase's backlog).
    await _wait(lambda: all(w in ended for w in wid_of.values()), 300, "probes completed")
    for sub in subs:
        await sub.unsubscribe()
    for cid, wid in wid_of.items():
        hist.record_value(max(1, int((placed_at[wid] - sent[cid]) * 1e6)))
    for _ in timed_out:
        hist.record_value(int(PROBE_TIMEOUT_S * 1e6))
    pct = {p: hist.get_value_at_percentile(p) / 1000 for p in (50, 90, 99, 99.9)}
    ack = HdrHistogram(1, 60_000_000, 3)
    for cid, at in acked.items():
        ack.record_value(max(1, int((at - sent[cid]) * 1e6)))
    segments = _segments(sent_wall, wid_of, intake_at, placed_raw, placed_wall)
    if args.timeline:
        # One probe per row: sent (wall clock), submit -> placed, submit -> intake's answer
        # (seconds); analysed by bench/report_bursts.py.
        timeline = {
            "rate": rate,
            "probes": [
                [sent_wall[cid], placed_at[wid] - sent[cid], acked[cid] - sent[cid]]
                for cid, wid in wid_of.items()
            ],
            "reports_seen": reports_seen,
        }
        path = Path(f"{args.timeline}.{rate:.0f}.json")
        path.write_text(json.dumps(timeline))
        print(f"wrote {path}", flush=True)
    await asyncio.sleep(1.0)  # and the readers of those ends have read them
    return {
        "pending_at_start": queued,
        "target_rate_per_s": rate,
        "achieved_rate_per_s": round(achieved, 1),
        "probes": len(wid_of) + len(timed_out),
        "timed_out": len(timed_out),
        "p50_ms": round(pct[50], 3),
        "p90_ms": round(pct[90], 3),
        "p99_ms": round(pct[99], 3),
        "p999_ms": round(pct[99.9], 3),
        "max_ms": round(hist.get_max_value() / 1000, 3),
        "accepted_p50_ms": round(ack.get_value_at_percentile(50) / 1000, 3),
        "accepted_p99_ms": round(ack.get_value_at_percentile(99) / 1000, 3),
        "peak_running": running[1],
        "placed_to_run_started_p50_ms": _p50_ms(to_start),
        "run_end_to_logged_p50_ms": _p50_ms(to_logged_end),
        "segments_ms": segments,
        "goal_p50_ms": GOAL_P50_MS,
        "goal_p99_ms": GOAL_P99_MS,
        "pass": pct[50] <= GOAL_P50_MS and pct[99] <= GOAL_P99_MS,
        "leader_per_s": _leader_per_s(leader_before, leader_after, sending_s),
        "cpu_cores": round(sum(cpu.values()) / sending_s, 2) if cpu else None,
        "cpu_ms_per_probe": _by_process(cpu, total),
        "stack_cpu_ms_per_probe": _stack_per_probe(cpu, total, gone),
        "stack_kernel_ms_per_probe": _stack_per_probe(kernel, total, gone),
        "stack_wakeups_per_probe": _stack_per_probe(wakeups, total, gone, scale=1.0),
        "kernel_ms_per_probe": _by_process({n: k for n, k in kernel.items() if k > 0}, total),
        "wakeups_per_probe": _by_process(wakeups, total, scale=1.0, digits=2),
        "processes_gone": gone,
        "goal_stack_cpu_ms": GOAL_STACK_CPU_MS,
        "messages_per_probe": _messages_per_probe(connz_before, connz_after, total),
    }


async def _placement_stats(nc: nats.NATS) -> dict[str, Any] | None:
    """The leader's cycle counters (``PlacementStats``), or None if it did not answer."""
    try:
        msg = await nc.request(s.QUERY_PLACEMENT_STATS, b"{}", timeout=5.0)
    except (TimeoutError, nats.errors.Error):
        return None
    stats: dict[str, Any] = json.loads(msg.data)
    return stats


def _leader_per_s(
    before: dict[str, Any] | None, after: dict[str, Any] | None, seconds: float
) -> dict[str, float] | None:
    """What the leader's cycles did per second of sending: cycles, decisions, and the
    seconds they spent in all, deciding, and waiting for their appends' acks."""
    if before is None or after is None or before.get("epoch") != after.get("epoch"):
        return None  # no answer, or leadership moved: the counters restarted
    keys = ("cycles", "decisions", "sum_s", "decide_s", "append_wait_s")
    return {k: round((after.get(k, 0) - before.get(k, 0)) / seconds, 3) for k in keys}


def _disk_and_steal(result: dict[str, Any]) -> str:
    """The machine line's disk speed and CPU steal, when measured (older results lack them)."""
    text = ""
    f = result.get("fsync_reference_ms")
    if f:
        text += (
            f"; a 4 KiB write + fsync on its disk took p50 {f['before'][0]} / p90 "
            f"{f['before'][1]} ms before and {f['after'][0]} / {f['after'][1]} ms after"
        )
    steal = result.get("cpu_steal_share")
    if steal is not None:
        text += f"; CPU time stolen by the hypervisor during the run: {steal:.1%}"
    return text


def render(result: dict[str, Any]) -> str:
    t = result["throughput"]
    ok = {True: "PASS", False: "FAIL"}
    fsync = "every write" if result["sync_always"] else "JetStream's default (every 2 min)"
    staged = result.get("staged_in_memory", [])
    staging = f"on tmpfs ({', '.join(staged)})" if staged else "in nats-server's store"
    lines = [
        "# Live benchmark (`make bench-live`)",
        "",
        f"Machine: {result['machine']}; its speed: a 1M-iteration Python loop took "
        f"{result['reference_loop_ms'][0]} ms before the run and "
        f"{result['reference_loop_ms'][1]} ms after (this shared VM drifts: 20 to 93 ms "
        "on 2026-12-02 alone; every figure below scales with it)" + _disk_and_steal(result) + ". "
        f"JetStream fsync: {fsync}; atomic batches staged {staging}. "
        "Stack: one fake agent process with "
        f"{result['hosts']} hosts x {result['gpus_per_host']} GPUs ({result['fill_hosts']} "
        "of them full of protected work; its hosts' reports sent in batches, "
        "`--batch-reports`), one intake, one placement, health, dispatch, "
        "ranking, accounting; embedded NATS and Redis; the load generator on the same machine."
        + (
            f" **Diagnostic run: {', '.join(result['paused'])} stopped (SIGSTOP) while each "
            "latency phase sent its probes**, so these latencies are not the goal's figure"
            + (": the decision path's alone." if result.get("pause_off_path") else ".")
            if result.get("paused")
            else ""
        ),
        "",
        "| figure | value | goal | result |",
        "|---|---|---|---|",
        f"| accepted submissions/s ({t['submissions']} requests, {t['in_flight']} in "
        f"flight) | {t['accepted_per_s']} | >= {t['goal_per_s']:.0f} | {ok[t['pass']]} |",
    ]
    b = result.get("batch_throughput")
    if b:
        lines.append(
            f"| same, sent as `SubmitBatch` of {b['batch_size']} ({b['submissions']} workloads, "
            f"{b['in_flight']} batches in flight; measured after the latency phases) | "
            f"{b['accepted_per_s']} | >= {b['goal_per_s']:.0f} | {ok[b['pass']]} |"
        )
    idle = result.get("idle")
    if idle:
        per = _listed(idle["cores"])
        lines.append(
            f"| CPU with {result['latency'][0]['pending_at_start']} pending and nothing "
            f"submitted ({idle['seconds']} s): {idle['cpu_cores']} of 2 cores; cores: {per} "
            "| | | |"
        )
    for i, lat in enumerate(result["latency"]):
        goal = i == 0
        where = (
            f"{lat['probes']} probes offered at {lat['target_rate_per_s']:.0f}/s "
            f"(achieved {lat['achieved_rate_per_s']}/s), {lat['pending_at_start']} pending"
        )
        if lat.get("timed_out"):
            where += (
                f"; {lat['timed_out']} got no answer within {PROBE_TIMEOUT_S:.0f} s, counted "
                "at that (a lower bound)"
            )
        lines += [
            f"| submit -> placement decision p50 ({where}) | {lat['p50_ms']} ms | "
            + (
                f"<= {lat['goal_p50_ms']} ms | {ok[lat['p50_ms'] <= lat['goal_p50_ms']]} |"
                if goal
                else "(not a goal rate) | |"
            ),
            f"| same, p90 | {lat['p90_ms']} ms | | |",
            f"| same, p99 | {lat['p99_ms']} ms | "
            + (
                f"<= {lat['goal_p99_ms']} ms | {ok[lat['p99_ms'] <= lat['goal_p99_ms']]} |"
                if goal
                else "| |"
            ),
            f"| same, p99.9 / max | {lat['p999_ms']} / {lat['max_ms']} ms | | |",
            f"| submit -> intake's answer (the submission appended and acknowledged), p50 / "
            f"p99 | {lat['accepted_p50_ms']} / {lat['accepted_p99_ms']} ms | | |",
            f"| probes running at once, peak (free GPUs: {result['free_gpus']}; at that, a "
            f"probe waits for a run to end) | {lat['peak_running']} | | |",
            "| after the decision (not in the goal): placed -> its run started on the agent, "
            "p50; its run's end -> the completion seen in the log, p50 | "
            f"{lat.get('placed_to_run_started_p50_ms')} ms; "
            f"{lat.get('run_end_to_logged_p50_ms')} ms | | |",
        ]
        if lat.get("segments_ms"):
            legs = "; ".join(f"{n} {p50} / {p99}" for n, (p50, p99) in lat["segments_ms"].items())
            lines.append(
                "| where the decision's time goes, by the records' own clocks, p50 / p99 ms: "
                f"{legs} | | | |"
            )
        if lat.get("leader_per_s"):
            lead = lat["leader_per_s"]
            lines.append(
                f"| same, the placement leader while sending, per second: {lead['cycles']:.0f} "
                f"cycles for {lead['decisions']:.0f} decisions; {lead['sum_s']} s in cycles, "
                f"of which {lead['decide_s']} s deciding and {lead['append_wait_s']} s waiting "
                "for the log to acknowledge their appends | | | |"
            )
        if lat.get("cpu_ms_per_probe"):
            per = _listed(lat["cpu_ms_per_probe"])
            lines.append(
                f"| same, CPU while sending: {lat['cpu_cores']} of {os.cpu_count()} cores; "
                f"ms per probe: {per} | | | |"
            )
        stack_ms = lat.get("stack_cpu_ms_per_probe")
        if lat.get("processes_gone"):
            lines.append(
                "| same, CPU per probe summed over the stack's processes: unknown, "
                f"{', '.join(lat['processes_gone'])} ended while the probes were sent | | | |"
            )
        elif stack_ms is not None:
            cap = lat["goal_stack_cpu_ms"]
            lines.append(
                "| same, CPU per probe summed over the stack's processes (not the load "
                f"generator) | {stack_ms} ms | "
                + (f"<= {cap} ms | {ok[stack_ms <= cap]} |" if goal else "| |")
            )
            kernel_ms = lat.get("stack_kernel_ms_per_probe")
            if kernel_ms is not None:
                per = _listed(lat["kernel_ms_per_probe"])
                lines.append(
                    "| same, of which in the kernel (system time: sockets, fsync, scheduling)"
                    f"{'; by process: ' + per if per else ''} | {kernel_ms} ms | | |"
                )
        woken = lat.get("stack_wakeups_per_probe")
        if woken is not None:
            per = _listed(lat["wakeups_per_probe"])
            lines.append(
                "| same, wake-ups per probe (voluntary context switches, all threads): "
                f"{woken} over the stack; by process: {per} | | | |"
            )
        msgs = lat.get("messages_per_probe")
        if msgs:
            by = _listed(msgs["out_by_connection"])
            by_in = _listed(msgs.get("in_by_connection", {}))
            lines.append(
                f"| same, messages per probe through nats-server (its `/connz`): {msgs['in']} "
                f"in, {msgs['out']} out; out by connection: {by}"
                + (f"; in by connection: {by_in}" if by_in else "")
                + " | | | |"
            )
    lines += ["", f"Command: `{result['command']}`; run at {result['when']}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--fill-hosts", type=int, default=500)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--batch", type=int, default=100, help="workloads per SubmitBatch")
    ap.add_argument(
        "--rates",
        type=lambda t: [float(x) for x in t.split(",")],
        default=[500.0, 150.0],
        help="probe rates per second; the first is the goal's (default 500,150)",
    )
    ap.add_argument("--probe-s", type=float, default=20.0)
    ap.add_argument("--nats-url")
    ap.add_argument("--redis-url")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument(
        "--pause-off-path",
        action="store_true",
        help="a diagnostic: SIGSTOP dispatch, accounting, the agent, health and ranking while "
        "each latency phase sends (placements are still decided and logged; runs start "
        "after); results in live-path-only.{md,json}",
    )
    ap.add_argument(
        "--pause",
        type=_paused_names,
        default=(),
        metavar="NAMES",
        help=f"a diagnostic: SIGSTOP only these of {','.join(OFF_PATH)} (comma-separated) while "
        "each latency phase sends, to see which weighs; printed only",
    )
    ap.add_argument(
        "--timeline",
        metavar="PATH",
        help="a diagnostic: write each latency phase's probes (sent, latency, intake's answer) "
        "and the times the runs' start and end records were seen, to PATH.<rate>.json, "
        "for bench/report_bursts.py",
    )
    ap.add_argument(
        "--side-probe",
        action="store_true",
        help="a diagnostic: while each latency phase sends, time an append to a stream of its "
        "own, a core-NATS request and an append to WORKLOADS every 20 ms from another "
        "process (bench/stream_probe.py); printed only",
    )
    ap.add_argument(
        "--no-sync-always",
        action="store_true",
        help="JetStream's default fsync (every 2 min) instead of every write: the cost figure",
    )
    args = ap.parse_args(argv)
    unwind_on_sigterm()  # a killed run stops its stack too
    if args.pause_off_path and args.pause:
        ap.error("give --pause-off-path (all of them) or --pause NAMES, not both")
    subset = bool(args.pause)
    if args.pause_off_path:
        args.pause = OFF_PATH
    free = _free_gpus(args)
    if _never_fits(args) > m.MAX_GPUS:
        # The pending runs ask for one host more than the free GPUs: intake refuses more.
        ap.error(
            f"--hosts {args.hosts} with --fill-hosts {args.fill_hosts} leaves {free} GPUs free; "
            f"a request may ask for at most {m.MAX_GPUS}: fill more hosts"
        )
    no_runs = [n for n in args.pause if n in RUNS_NEED]
    if no_runs and max(args.rates) * args.probe_s > free:
        # No run starts or ends while the agent or dispatch is stopped: every probe must fit.
        ap.error(
            f"--pause: with {', '.join(no_runs)} stopped, "
            f"rate x --probe-s must fit in the {free} free GPUs "
            f"(got {max(args.rates):.0f} x {args.probe_s:g})"
        )
    run_dir = Path(tempfile.mkdtemp(prefix="allot-bench-live-"))
    config = StackConfig(
        run_dir=run_dir,
        nats_url=args.nats_url,
        redis_url=args.redis_url,
        agents=(AgentSpec("bench", hosts=args.hosts, gpus=8),),
        placements=1,
        heartbeat_timeout_s=30.0,
        heartbeat_s=5.0,  # 1,000 hosts: 200 heartbeats/s
        sync_always=not args.no_sync_always,
        log_level="WARNING",
        # The issue-4 pipeline only, as measured before the dashboard existed: it follows
        # the whole log too, and would share the 2 cores with what is measured.
        dashboard=False,
    )
    reference_before = machine_reference_s()
    fsync_before = fsync_reference_ms(run_dir)
    ticks_before = _cpu_ticks()
    print(f"starting the stack ({args.hosts} fake hosts); logs in {run_dir}/logs", flush=True)
    with Stack(config) as stack:
        pids = {name: proc.pid for name, proc in stack.procs.items()}
        pids[LOAD_GENERATOR] = os.getpid()
        staged = stack.servers.nats.staged_in_memory if stack.servers.nats else []
        for name, server in (("nats-server", stack.servers.nats), ("redis", stack.servers.redis)):
            if server is not None:
                pids[name] = server.pid
        monitor = stack.servers.nats.monitor_url if stack.servers.nats else None
        result = asyncio.run(run_bench(stack.servers.nats_url, args, pids, monitor))
    result["reference_loop_ms"] = [
        round(reference_before * 1000, 1),
        round(machine_reference_s() * 1000, 1),
    ]
    ticks_after = _cpu_ticks()
    result["fsync_reference_ms"] = {"before": fsync_before, "after": fsync_reference_ms(run_dir)}
    ticks = ticks_after[0] - ticks_before[0]
    result["cpu_steal_share"] = (
        round((ticks_after[1] - ticks_before[1]) / ticks, 4) if ticks else None
    )
    result["machine"] = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    result["sync_always"] = not args.no_sync_always
    result["staged_in_memory"] = staged
    flags = " --no-sync-always" * args.no_sync_always + " --pause-off-path" * args.pause_off_path
    flags += f" --pause {','.join(args.pause)}" * subset
    result["command"] = "make bench-live" + (
        f" (python bench/bench_live.py{flags})" if flags else ""
    )
    result["pause_off_path"] = args.pause_off_path
    result["paused"] = list(args.pause)
    result["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = render(result)
    print(text)
    if subset or args.side_probe:
        print("(--pause / --side-probe: a diagnostic, printed only)")
    elif not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        stem = "live-nosync" if args.no_sync_always else "live"
        stem += "-path-only" if args.pause_off_path else ""
        (RESULTS / f"{stem}.md").write_text(text, encoding="utf-8")
        (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {RESULTS / stem}.md and {stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
