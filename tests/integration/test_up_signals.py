"""``allot up`` stops cleanly however many SIGTERMs it gets (``kill`` twice, ``timeout``
forwarding its own): its handler once called ``threading.Event.set()``, which deadlocks
when a second signal lands while the first handler holds the Event's lock, and the stack
then hung with its servers running (2026-12-03). And a TERM to its whole process group
(``timeout``, systemd, a container runtime) stops it cleanly too: the services, which get
that TERM as well and exit first, were once reported as dead (exit 1)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from live_harness import start_allot

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("to_group", [False, True], ids=["200-to-allot-up", "one-to-the-group"])
async def test_sigterms_stop_allot_up_once_and_cleanly(
    fresh_log: str, redis_url: str, tmp_path: Path, to_group: bool
) -> None:
    argv = ["up", "--agents", "1", "--hosts", "1", "--run-dir", str(tmp_path / "run")]
    argv += ["--nats-url", fresh_log, "--redis-url", redis_url]
    proc = await start_allot(argv, own_group=True)  # the stack, whatever happens here
    assert proc.stdout is not None
    seen = b""
    try:
        async with asyncio.timeout(90):
            while b"try:" not in seen:  # the last line of the banner: the stack is ready
                line = await proc.stdout.readline()
                assert line, seen
                seen += line
        if to_group:
            os.killpg(proc.pid, signal.SIGTERM)
        for _ in range(0 if to_group else 200):  # microseconds apart: some land inside
            proc.send_signal(signal.SIGTERM)  # the handler of another
        rest, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:  # hung: take the stack down with it
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    assert proc.returncode == 0, seen + rest
    assert rest.decode().splitlines()[-2:] == ["stopping...", "stopped."]
