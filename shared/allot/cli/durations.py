"""Durations on the command line: ``300``, ``90s``, ``30m``, ``2h``, ``7d``, ``1.5h``.

``duration_label`` writes a whole number of seconds the way ``parse_duration`` reads it
(exact, so a window reads back as typed); ``allot.core.duration_text`` is for people
(one decimal, any amount)."""

from __future__ import annotations

import argparse
import re
from fractions import Fraction

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str) -> int:
    """Whole seconds in ``text``; argparse turns the error into a usage error naming the
    option. A value that is not a whole number of seconds (``0.4s``, ``1.0001m``) is
    refused: rounding it made ``--min-runtime 0.4s`` a silent 0 (no protection at all)."""
    match = _PATTERN.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (a number with an optional unit s, m, h or d)"
        )
    # Fraction, not float: 0.1h is exactly 360 s, where a float makes it 360.00000000000006.
    seconds = Fraction(match.group(1)) * _UNITS[match.group(2)]
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
