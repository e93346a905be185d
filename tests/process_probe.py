"""What the tests of the agent's leftover sweep read of processes, independently of the
code under test (``allot.services.agent.gpu_exec`` reads ``/proc`` too, its own way): whether a pid
still runs, and which processes a session holds. Linux only (``/proc``)."""

from __future__ import annotations

import os
from pathlib import Path

GONE = "ZXx"
"""``/proc/<pid>/stat`` states of an exited process (a zombie holds nothing, GPUs too)."""


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces
    and parentheses), or None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in GONE


def session(sid: int) -> list[int]:
    """The running processes of session ``sid`` (a part's launcher and what it forked)."""
    out = []
    for name in os.listdir("/proc"):
        fields = _stat_fields(name) if name.isdigit() else None
        if fields is not None and int(fields[3]) == sid and fields[0] not in GONE:
            out.append(int(name))
    return out
