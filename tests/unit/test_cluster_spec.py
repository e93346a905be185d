"""load_cluster: deterministic host names, partitions dealt in order, health events, and
errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from allot.core.errors import ValidationError
from allot.core.model import HostState
from allot.sim.cluster import HealthEvent, load_cluster


def cluster(**extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "host_groups": [
            {"prefix": "a-", "count": 3, "gpus": 8},
            {"prefix": "b-", "count": 2, "gpus": 4},
        ]
    }
    data.update(extra)
    return data


def test_hosts_are_named_prefix_and_four_digits_in_group_order() -> None:
    spec = load_cluster(cluster())
    assert [(h.id, h.gpus) for h in spec.hosts] == [
        ("a-0000", 8),
        ("a-0001", 8),
        ("a-0002", 8),
        ("b-0000", 4),
        ("b-0001", 4),
    ]
    assert all(h.state is HostState.HEALTHY for h in spec.hosts)
    assert spec.total_gpus == 32
    assert spec.partitions == {}
    assert spec.health_events == ()


def test_partitions_deal_hosts_in_order_and_allow_an_empty_team() -> None:
    spec = load_cluster(cluster(partitions={"nlp": 2, "tiny": 0, "vision": 2}))
    assert spec.partitions == {
        "nlp": ("a-0000", "a-0001"),
        "tiny": (),
        "vision": ("a-0002", "b-0000"),
    }


def test_the_short_lane_is_the_last_hosts_in_host_order() -> None:
    assert load_cluster(cluster(short_lane=2)).short_lane == ("b-0000", "b-0001")
    assert load_cluster(cluster(short_lane=0)).short_lane == ()
    assert load_cluster(cluster()).short_lane == ()


def test_a_lane_given_elsewhere_replaces_the_files_unread() -> None:
    # A count too large for this cluster would be refused (see the error table below); a
    # command line that sets the lane itself (``allot simulate --short-lane``) replaces it.
    assert load_cluster(cluster(short_lane=5), lane_of_file=False).short_lane == ()
    for bad in ("two", -1, True):  # what is no count at all is still refused
        with pytest.raises(ValidationError) as err:
            load_cluster(cluster(short_lane=bad), lane_of_file=False)
        assert err.value.field == "short_lane"
    with pytest.raises(ValidationError) as err:
        load_cluster(cluster(short_lane=5))
    assert err.value.field == "short_lane"


def test_health_events_are_sorted_by_time_then_file_order() -> None:
    spec = load_cluster(
        cluster(
            health_events=[
                {"host": "a-0001", "time": 500, "event": "repaired"},
                {"host": "a-0001", "time": 100, "event": "unhealthy"},
                {"host": "b-0000", "time": 500, "event": "unhealthy"},
            ]
        )
    )
    assert spec.health_events == (
        HealthEvent("a-0001", 100.0, "unhealthy"),
        HealthEvent("a-0001", 500.0, "repaired"),
        HealthEvent("b-0000", 500.0, "unhealthy"),
    )


def test_loads_from_yaml_text_with_quoted_team_names() -> None:
    text = """
name: "lab"
host_groups:
  - {prefix: "gpu", count: 4, gpus: 8}
partitions:
  "103959": 1
  "6214e9": 3
"""
    spec = load_cluster(yaml.safe_load(text))
    assert spec.partitions["103959"] == ("gpu0000",)
    assert spec.partitions["6214e9"] == ("gpu0001", "gpu0002", "gpu0003")


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        pytest.param({}, "host_groups", "required", id="no-host-groups"),
        pytest.param({"host_groups": []}, "host_groups", "at least one", id="empty-host-groups"),
        pytest.param(
            {"host_groups": {"prefix": "a"}}, "host_groups", "list", id="groups-not-a-list"
        ),
        pytest.param(
            {"host_groups": [{"prefix": "a", "count": 0, "gpus": 8}]},
            "host_groups[0].count",
            "> 0",
            id="zero-hosts",
        ),
        pytest.param(
            {"host_groups": [{"prefix": "a", "count": 2, "gpus": "8"}]},
            "host_groups[0].gpus",
            "integer",
            id="gpus-as-a-string",
        ),
        pytest.param(
            {"host_groups": [{"prefix": "a", "count": 2, "gpus": True}]},
            "host_groups[0].gpus",
            "integer",
            id="gpus-as-a-bool",
        ),
        pytest.param(
            {"host_groups": [{"prefix": "a", "count": 2}]},
            "host_groups[0].gpus",
            "required",
            id="group-missing-gpus",
        ),
        pytest.param(
            {"host_groups": [{"prefix": "a", "count": 2, "gpus": 8, "gpu": 8}]},
            "host_groups[0].gpu",
            "unknown key",
            id="misspelt-group-key",
        ),
        pytest.param(
            cluster(partition={"a": 1}), "cluster.partition", "unknown key", id="misspelt-top-key"
        ),
        pytest.param(
            {
                "host_groups": [
                    {"prefix": "a", "count": 2, "gpus": 8},
                    {"prefix": "a", "count": 1, "gpus": 8},
                ]
            },
            "host_groups[1].prefix",
            "also made by host_groups[0]",
            id="two-groups-make-the-same-host",
        ),
        pytest.param(
            cluster(partitions={"nlp": 4, "vision": 2}),
            "partitions",
            "only 5",
            id="partitions-exceed-hosts",
        ),
        pytest.param(
            cluster(partitions={"nlp": -1}), "partitions.nlp", ">= 0", id="negative-partition"
        ),
        pytest.param(
            cluster(partitions={103959: 1}), "partitions.103959", "quote", id="unquoted-team-name"
        ),
        pytest.param(
            cluster(partitions=["nlp"]), "partitions", "mapping", id="partitions-not-a-mapping"
        ),
        pytest.param(
            cluster(health_events=[{"host": "z-0000", "time": 1, "event": "unhealthy"}]),
            "health_events[0].host",
            "unknown host",
            id="event-for-an-unknown-host",
        ),
        pytest.param(
            cluster(health_events=[{"host": "a-0000", "time": 1, "event": "exploded"}]),
            "health_events[0].event",
            "unhealthy, repaired",
            id="unknown-event",
        ),
        pytest.param(
            cluster(health_events=[{"host": "a-0000", "time": -5, "event": "repaired"}]),
            "health_events[0].time",
            ">= 0",
            id="negative-event-time",
        ),
        pytest.param(cluster(short_lane=-1), "short_lane", ">= 0", id="negative-lane"),
        pytest.param(cluster(short_lane="1"), "short_lane", "integer", id="lane-as-a-string"),
        pytest.param(cluster(short_lane=5), "short_lane", "outside the lane", id="all-in-the-lane"),
        pytest.param(
            cluster(health_events=[{"host": "a-0000", "event": "repaired"}]),
            "health_events[0].time",
            "required",
            id="event-without-time",
        ),
    ],
)
def test_errors_name_the_field(data: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(ValidationError) as err:
        load_cluster(data)
    assert err.value.field == field
    assert reason in err.value.reason


def test_a_non_mapping_is_rejected() -> None:
    with pytest.raises(ValidationError) as err:
        load_cluster(["host_groups"])  # type: ignore[arg-type]
    assert err.value.field == "cluster"
