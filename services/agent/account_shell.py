"""Shell commands run as a part's account (``--run-as-user``): the agent's file work for
the part wherever the workload could have planted a link (``checkpoint``). As root, the
agent would follow such a link to a file only root may write; as the account, the kernel
checks what the account may do. Each command is bounded and killed with its session when
left unfinished, and its output is read from pipes the agent closes once it ends: a
process of the account may stop it, trace it, hold it on a FIFO or keep a copy of its
descriptors, and the agent must go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from allot.services.agent.accounts import Account

HELPER_PATH = "/usr/bin:/bin"
"""``PATH`` of the commands run as an account."""
OUTPUT_KEPT = 4096
"""Bytes of a helper's standard output and error kept (the rest is read and dropped)."""
KILLED_WAIT_S = 5.0
"""How long a killed helper may take to be reaped."""


class _Drain:
    """The read ends of a helper's output pipes, read as data comes and kept up to
    ``OUTPUT_KEPT`` bytes each; closed once the helper has ended, not at the end of the
    data (a process of the account may hold a copy of a write end)."""

    def __init__(self, *fds: int) -> None:
        self.kept = {fd: bytearray() for fd in fds}
        self._loop = asyncio.get_running_loop()
        for fd in fds:
            os.set_blocking(fd, False)
            self._loop.add_reader(fd, self._read, fd)

    def _read(self, fd: int) -> bool:
        """One read (the loop calls again while there is more); False at the end."""
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._loop.remove_reader(fd)
            return False
        kept = self.kept[fd]
        kept += chunk[: max(0, OUTPUT_KEPT - len(kept))]
        return True

    def close(self) -> None:
        for fd in self.kept:
            # What the helper wrote before it ended, up to what is kept.
            while len(self.kept[fd]) < OUTPUT_KEPT and self._read(fd):
                pass
            self._loop.remove_reader(fd)
            os.close(fd)

    def text(self, fd: int) -> str:
        return bytes(self.kept[fd]).decode(errors="replace")


async def as_account(account: Account, script: str, *args: str, timeout_s: float) -> str:
    """Run the shell ``script`` (arguments ``$1``...) as ``account`` in ``/``, with only
    ``PATH`` and the account's own variables, in a session of its own (no terminal of the
    agent's); its standard output. ``OSError`` with its standard error when it fails, or
    when it has not ended after ``timeout_s``: a workload of the same uid may stop it or
    hold it on a FIFO, and the agent must go on. Killed with its session whenever it is
    left unfinished (a timeout, the caller cancelled)."""
    drain: _Drain | None = None
    proc: asyncio.subprocess.Process | None = None
    ends: list[int] = []
    try:
        out_r, out_w = os.pipe()
        ends += (out_r, out_w)
        err_r, err_w = os.pipe()
        ends += (err_r, err_w)
        drain = _Drain(out_r, err_r)
        ends = [out_w, err_w]  # the read ends are the drain's now
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            script,
            "sh",
            *args,
            env={"PATH": HELPER_PATH, **account.env()},
            cwd="/",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            start_new_session=True,
            user=account.uid,
            group=account.gid,
            extra_groups=list(account.groups),
        )
        for fd in ends:
            os.close(fd)
        ends = []
        try:
            code = await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            raise OSError(f"not done within {timeout_s:.0f} s as {account.name}") from None
    finally:
        for fd in ends:
            os.close(fd)
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), KILLED_WAIT_S)
        if drain is not None:
            drain.close()
    if code != 0:
        raise OSError(drain.text(err_r).strip() or f"exit {code}")
    return drain.text(out_r)


__all__ = ["OUTPUT_KEPT", "as_account"]
