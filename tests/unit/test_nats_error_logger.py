"""A service whose NATS is unreachable says so (``bus.nats_error_logger``), once per error
per ``ERROR_REPEAT_S``, instead of retrying in silence."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys

from structlog.testing import capture_logs

from allot.bus import ERROR_REPEAT_S, nats_error_logger


def test_each_error_is_logged_once_per_repeat_period() -> None:
    now = [100.0]
    on_error = nats_error_logger("allot-intake", clock=lambda: now[0])
    refused, reset = ConnectionRefusedError(111, "refused"), ConnectionResetError("reset")

    async def at(t: float, *errors: Exception) -> None:
        now[0] = t
        for e in errors:
            await on_error(e)

    with capture_logs() as logs:
        asyncio.run(at(100.0, refused, refused, reset))
        asyncio.run(at(100.0 + ERROR_REPEAT_S - 0.1, refused, reset))
        asyncio.run(at(100.0 + ERROR_REPEAT_S, refused))
    assert [(e["event"], e["connection"], e["error"]) for e in logs] == [
        ("nats error", "allot-intake", repr(refused)),
        ("nats error", "allot-intake", repr(reset)),
        ("nats error", "allot-intake", repr(refused)),
    ]
    assert all(e["log_level"] == "warning" for e in logs)


async def test_a_service_started_without_a_reachable_nats_logs_why() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"nats://ann:secret@127.0.0.1:{port}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "allot.services.intake",
        "--nats-url",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    seen = b""
    try:
        async with asyncio.timeout(30):  # the first attempt fails at once
            while b"nats error" not in seen:
                line = await proc.stdout.readline()
                assert line, seen  # ended without saying why
                seen += line
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), 30)
    warning = seen.splitlines()[-1].decode()
    assert "ConnectionRefusedError" in warning
    assert b"secret" not in seen + rest  # the URL's password is never logged
    assert proc.returncode == 0
