"""``bus.stream_differs``: which of the fields Allot sets an existing stream lacks, so that
a stream as it should be is only read (the services' login may not update one: decision
0082) and one that differs is updated, naming what changed."""

from __future__ import annotations

import dataclasses

import pytest
from nats.js.api import StorageType, StreamConfig

from allot import bus

WANTED = {c.name: c for c in bus.stream_configs(1)}


def _has(name: str, **changes: object) -> StreamConfig:
    """What a server would report for the stream Allot asked for, with ``changes``."""
    return dataclasses.replace(WANTED[name], **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "changes", "takes_atomic", "differs"),
    [
        ("WORKLOADS", {}, True, []),
        ("USAGE", {}, True, []),
        # the server's order of subjects is not a difference
        ("WORKLOADS", {"subjects": sorted(WANTED["WORKLOADS"].subjects or [])[::-1]}, True, []),
        ("HOSTS", {"subjects": [*(WANTED["HOSTS"].subjects or []), "x.>"]}, True, ["subjects"]),
        ("HOSTS", {"subjects": (WANTED["HOSTS"].subjects or [])[1:]}, True, ["subjects"]),
        ("HOSTS", {"num_replicas": 3}, True, ["num_replicas"]),
        ("HOSTS", {"storage": StorageType.MEMORY}, True, ["storage"]),
        ("USAGE", {"max_msgs_per_subject": -1}, True, ["max_msgs_per_subject"]),
        ("HOSTS", {"max_age": 3600.0}, True, ["max_age"]),
        ("HOSTS", {"duplicate_window": 119.0}, True, ["duplicate_window"]),
        # read back from nanoseconds: a rounding is no difference
        ("HOSTS", {"duplicate_window": 120.0 + 1e-9}, True, []),
        ("WORKLOADS", {"allow_atomic": None}, True, ["allow_atomic"]),
        # a server before 2.12 drops the field: nothing to update, nothing it would keep
        ("WORKLOADS", {"allow_atomic": None}, False, []),
        ("HOSTS", {"num_replicas": 3, "max_age": 1.0}, True, ["num_replicas", "max_age"]),
    ],
)
def test_only_a_wanted_field_that_differs_counts(
    name: str, changes: dict[str, object], takes_atomic: bool, differs: list[str]
) -> None:
    assert bus.stream_differs(WANTED[name], _has(name, **changes), takes_atomic) == differs


def test_a_field_allot_does_not_set_is_left_to_the_operator() -> None:
    """A limit set by hand (max_bytes) is not Allot's to undo at every service start."""
    assert bus.stream_differs(WANTED["WORKLOADS"], _has("WORKLOADS", max_bytes=10**9), True) == []
