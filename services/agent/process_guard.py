"""Keeping the agent's memory and environment from its own workloads.

An agent starts its workloads under its own user. By default a process may read
``/proc/<pid>/environ`` and ``/proc/<pid>/mem`` of any process of the same user and
``ptrace`` it, so any job could read the agent's NATS password (``ALLOT_NATS_PASSWORD``,
``ALLOT_NATS_URL``) and speak as its host's agent. ``prctl(PR_SET_DUMPABLE, 0)`` closes
that on Linux: those reads and a ptrace attach then need ``CAP_SYS_PTRACE`` (the kernel
also hands the process's ``/proc`` files to root and writes no core dump of it). A
workload is dumpable again: ``execve`` resets the flag, so the agent still reads its own
parts' environments (``gpu_exec.LeftoverSweep``).

What it does not cover (docs/security.md): ``/proc/<pid>/cmdline``, which every process
reads (never give a password in ``--nats-url``); the files the agent's user can read; a
workload running as root (``CAP_SYS_PTRACE`` or ``CAP_SYS_ADMIN``); and the instant
between the agent's ``execve`` and this call, which ``python -m allot.services.agent``
keeps short by making it first.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4


def forbid_inspection() -> str | None:
    """Make this process non-dumpable (idempotent). None when done; otherwise why not (not
    Linux, no libc, the call refused), for the caller to log."""
    if not sys.platform.startswith("linux"):
        return f"not on Linux ({sys.platform}): no prctl(PR_SET_DUMPABLE)"
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError) as e:
        return f"prctl not found in libc: {e}"
    # prctl(int option, unsigned long arg2..arg5): declared, so the unused arguments are
    # zero in full width (the kernel refuses PR_SET_DUMPABLE with garbage in them).
    prctl.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]
    prctl.restype = ctypes.c_int
    if prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return f"prctl(PR_SET_DUMPABLE, 0) failed: {os.strerror(ctypes.get_errno())}"
    if prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        return "prctl(PR_SET_DUMPABLE, 0) returned 0 but the process is still dumpable"
    return None


__all__ = ["forbid_inspection"]
