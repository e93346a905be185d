"""Durations on the command line: ``300``, ``90s``, ``30m``, ``2h``, ``7d``, ``1.5h``, and
parts added up, largest unit first (``1h30m``, ``2d12h``, ``1m30s``), as Slurm's ``--time``
and Go's durations write them.

``duration_label`` writes a whole number of seconds the way ``parse_duration`` reads it
(exact, so a window reads back as typed); ``allot.core.duration_text`` is for people
(one decimal, any amount)."""

from __future__ import annotations

import argparse
import re
from fractions import Fraction

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_COMPOUND = re.compile(r"^\s*(?:\d+(?:\.\d+)?[smhd]){2,4}\s*$")
_ORDER = "dhms"


def parse_duration(text: str) -> int:
    """Whole seconds in ``text``; argparse turns the error into a usage error naming the
    option. A value that is not a whole number of seconds (``0.4s``, ``1.0001m``) is
    refused: rounding it made ``--min-runtime 0.4s`` a silent 0 (no protection at all)."""
    match = _PATTERN.match(text)
    if match is not None:
        # Fraction, not float: 0.1h is exactly 360 s, where a float makes it 360.000...06.
        seconds = Fraction(match.group(1)) * _UNITS[match.group(2)]
    elif _COMPOUND.match(text):
        parts = _PART.findall(text)
        units = [unit for _, unit in parts]
        if units != sorted(set(units), key=_ORDER.index):  # each unit once, largest first
            raise argparse.ArgumentTypeError(
                f"{text!r}: give each unit once, largest first (like 1h30m or 2d12h)"
            )
        seconds = sum((Fraction(n) * _UNITS[u] for n, u in parts), Fraction(0))
    else:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (a number with an optional unit s, m, h or d, or "
            "parts like 1h30m)"
        )
    if seconds.denominator != 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is {float(seconds):g} s: give a whole number of seconds"
        )
    return int(seconds)


def duration_label(seconds: float) -> str:
    """``7d``, ``1d``, ``12h``, ``90m``, ``45s``: the largest unit that divides evenly."""
    s = round(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size and s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"
