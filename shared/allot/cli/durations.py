"""Durations on the command line: ``300``, ``90s``, ``30m``, ``2h``, ``7d``."""

from __future__ import annotations

import argparse
import re

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str) -> int:
    """Seconds in ``text``; argparse turns the ValueError into a usage error."""
    match = _PATTERN.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (a number with an optional unit s, m, h or d)"
        )
    return round(float(match.group(1)) * _UNITS[match.group(2)])
