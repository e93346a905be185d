"""An exclusive lock on a file that holds its owner's pid: one ``allot up`` per run
directory, one real agent per host on a machine. ``flock`` is released by the kernel when
the owner exits, even by SIGKILL, so a crashed owner never leaves a stale lock."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class LockHeldError(Exception):
    """Another live process holds the lock; ``holder`` is the pid it wrote (text)."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"held by pid {holder}")
        self.holder = holder


def acquire(path: Path) -> int:
    """Lock ``path`` (made with its folder if missing) and write this pid into it; keep the
    returned descriptor open as long as the lock must hold. Raises ``LockHeldError``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise LockHeldError(holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
