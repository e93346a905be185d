"""Durations for people: ``42s``, ``3.5m``, ``2.9h``, ``41.8d``. The one formatter of the
reason texts, the CLI's tables, the simulator's report pages and the dashboard."""

from __future__ import annotations


def format_duration(seconds: float | None) -> str:
    """One unit, one decimal; ``-`` for a missing value; a negative span (clocks apart)
    reads ``0s``."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
