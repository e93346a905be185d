"""The name a part's own files and directories go by on its host: ``<workload>.<attempt>.
<host>`` (its output file, a session's live directory, its cgroup). Tokens hold no dot,
so the name reads back (``part_of``): a restarted agent knows whose a leftover is."""

from __future__ import annotations


def part_name(workload_id: str, attempt: int, host: str) -> str:
    return f"{workload_id}.{attempt}.{host}"


def part_of(name: str) -> tuple[str, int, str] | None:
    """The part ``name`` names (``part_name``), or None."""
    wid, dot, rest = name.partition(".")
    attempt, dot2, host = rest.partition(".")
    if not (dot and dot2 and wid and host and attempt.isdigit()) or "." in host:
        return None
    return wid, int(attempt), host


__all__ = ["part_name", "part_of"]
