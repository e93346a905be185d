"""``allot simulate --compare``'s printed table: the wait-by-allocation section is headed by
the policies' names, each over its own column (its cells are wider than the table's)."""

from __future__ import annotations

from typing import Any

import pytest

from allot.sim.compare import render_summary


def _report(waits: dict[str, dict[str, float]]) -> dict[str, Any]:
    return {
        "workloads": 3,
        "completed": 3,
        "preemptions": 0,
        "requeues": 0,
        "occupancy": 0.5,
        "unallocated_fraction": 0.0,
        "owed_delivered": {"overall": 1.0, "by_allocation": {a: {"ratio": 1.0} for a in waits}},
        "wait_s": {
            "all": {"p50": 0.0, "p90": 60.0, "p99": 600.0, "mean": 30.0},
            "by_size": {},
            "by_kind": {},
            "by_allocation": waits,
        },
    }


@pytest.mark.parametrize(
    "names", [("partitioned", "fairshare"), ("a-policy-with-a-long-name", "b")]
)
def test_the_wait_by_allocation_columns_are_headed_by_their_policies(
    names: tuple[str, str],
) -> None:
    first = {
        "nlp": {"mean": 60.0, "p90": 120.0, "p99": 3600.0},
        "vision": {"mean": 0.0, "p90": 0.0, "p99": 0.0},
    }
    second = {"nlp": {"mean": 1.0, "p90": 2.0, "p99": 3.0}}
    text = render_summary({names[0]: _report(first), names[1]: _report(second)})
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("wait by allocation"))
    header, legend, *rows = lines[at : at + 4]
    assert header.split()[3:] == list(names)  # "wait by allocation" then the names
    assert legend.count("mean / p90 / p99") == 2 and legend.endswith("mean / p90 / p99")
    assert len(legend) == len(header)
    # Each name's last letter sits over the last letter of its column's cells.
    ends = [header.index(names[0]) + len(names[0]), len(header)]
    nlp = next(r for r in rows if r.strip().startswith("nlp"))
    assert nlp[: ends[0]].endswith("1.0m / 2.0m / 1.0h")
    assert nlp[: ends[1]].endswith("1s / 2s / 3s") and len(nlp) == ends[1]
    vision = next(r for r in rows if r.strip().startswith("vision"))
    assert vision.endswith("- / - / -") and len(vision) == ends[1]
