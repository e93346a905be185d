"""Turn a cluster description (a YAML-loaded mapping) into a ``ClusterSpec``.

Input (``cluster.yaml`` after loading; names must be strings, so quote hex-like team names)::

    name: "ai2-like"                  # optional, informational
    host_groups:                      # required unless ``hosts`` is given; non-empty
      - {prefix: "node-", count: 48, gpus: 8}
    hosts:                            # optional: hosts by name (``allot export`` writes these)
      - {id: "h01", gpus: 8}
    partitions:                       # optional: team -> number of hosts
      "pretrain": 12
      "evals": 4
    short_lane: 1                     # optional: the last N hosts form the short lane
    health_events:                    # optional
      - {host: "node-0003", time: 86400, event: "unhealthy"}
      - {host: "node-0003", time: 172800, event: "repaired"}

Output: ``ClusterSpec`` with

* ``hosts``: for each group in order, ``count`` hosts named ``f"{prefix}{i:04d}"`` for
  ``i = 0 .. count-1``, each with ``gpus`` GPUs, then the named ``hosts`` in file order;
  all HEALTHY. Host ids must be unique.
* ``partitions``: team -> host ids, for the ``partitioned`` baseline (static monopolies).
  Hosts are dealt out in host order, teams in the mapping's order: the first team gets the
  first ``n`` hosts, and so on. The counts must sum to at most the number of hosts.
  A team given 0 hosts, or absent, owns nothing: under the partitioned baseline its jobs
  wait for ever (the report counts them as never started), which is what a static
  monopoly does to a team that was not given one. Hosts left over after the last team
  belong to nobody and stay idle under that baseline. Other policies ignore partitions.
* ``short_lane``: the ids of the last ``short_lane`` hosts in host order: Fair Tree's short
  lane (``allot.core.policy.Policy.short``: there, allocated work starts only if it is
  small and briefly protected); the baselines ignore it. Default 0: no lane.
* ``health_events``: sorted by (time, file order); ``event`` is ``unhealthy`` (the host
  starts draining) or ``repaired`` (healthy again). Each names a known host.

Errors: ``ValidationError`` whose field is a path such as ``host_groups[1].count`` or
``partitions.pretrain`` and whose reason says what was wrong. Unknown keys are rejected,
so a misspelt ``partition:`` fails loudly instead of being ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from allot.core.errors import ValidationError
from allot.core.model import Host

HEALTH_EVENTS = ("unhealthy", "repaired")
_TOP_KEYS = frozenset({"name", "host_groups", "hosts", "partitions", "short_lane", "health_events"})
_GROUP_KEYS = frozenset({"prefix", "count", "gpus"})
_HOST_KEYS = frozenset({"id", "gpus"})
_EVENT_KEYS = frozenset({"host", "time", "event"})


@dataclass(frozen=True, slots=True)
class HealthEvent:
    host: str
    time: float
    event: str  # "unhealthy" | "repaired"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    hosts: tuple[Host, ...]
    partitions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    health_events: tuple[HealthEvent, ...] = ()
    short_lane: tuple[str, ...] = ()

    @property
    def total_gpus(self) -> int:
        return sum(host.gpus for host in self.hosts)


def load_cluster(data: Mapping[str, object], *, lane_of_file: bool = True) -> ClusterSpec:
    """Validate ``data`` (see the module docstring) and build the cluster it describes.
    ``lane_of_file=False``: the caller sets the short lane (a command-line count replaces
    the file's, which is still checked as a count but not against this cluster's size)."""
    if not isinstance(data, Mapping):
        raise ValidationError("cluster", f"must be a mapping, got {type(data).__name__}")
    _reject_unknown("cluster", data, _TOP_KEYS)
    named = data.get("hosts")
    grouped = data.get("host_groups")
    seen: dict[str, str] = {}  # host id -> the field that made it
    hosts = () if grouped is None and named is not None else _hosts(grouped, seen)
    hosts += _named_hosts(named, seen)
    partitions = _partitions(data.get("partitions"), hosts)
    events = _health_events(data.get("health_events"), {host.id for host in hosts})
    count = _positive_int("short_lane", data.get("short_lane", 0), zero_ok=True)  # either way
    lane = short_lane_of(hosts, count) if lane_of_file else ()
    return ClusterSpec(hosts=hosts, partitions=partitions, health_events=events, short_lane=lane)


def short_lane_of(hosts: tuple[Host, ...], count: object) -> tuple[str, ...]:
    """The ids of the last ``count`` hosts (``short_lane``), checked."""
    n = _positive_int("short_lane", count, zero_ok=True)
    if n >= len(hosts):
        raise ValidationError(
            "short_lane", f"must leave some of the {len(hosts)} hosts outside the lane, got {n}"
        )
    return tuple(host.id for host in hosts[len(hosts) - n :]) if n else ()


def _reject_unknown(where: str, data: Mapping[str, object], allowed: frozenset[str]) -> None:
    unknown = sorted(str(key) for key in data if key not in allowed)
    if unknown:
        raise ValidationError(
            f"{where}.{unknown[0]}",
            f"unknown key (allowed: {', '.join(sorted(allowed))})",
        )


def _record(where: str, value: object, keys: frozenset[str]) -> Mapping[str, object]:
    """A mapping with exactly ``keys``: each one required, nothing else allowed."""
    if not isinstance(value, Mapping):
        raise ValidationError(where, f"must be a mapping, got {type(value).__name__}")
    _reject_unknown(where, value, keys)
    for key in sorted(keys):
        if key not in value:
            raise ValidationError(f"{where}.{key}", "required")
    return value


def _positive_int(where: str, value: object, *, zero_ok: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(where, f"must be an integer, got {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        raise ValidationError(where, f"must be {'>= 0' if zero_ok else '> 0'}, got {value}")
    return value


def _list(where: str, value: object) -> list[object]:
    if not isinstance(value, list | tuple):
        raise ValidationError(where, f"must be a list, got {type(value).__name__}")
    return list(value)


def _hosts(groups: object, seen: dict[str, str]) -> tuple[Host, ...]:
    if groups is None:
        raise ValidationError(
            "host_groups", "required: a list of {prefix, count, gpus} (or hosts: [{id, gpus}])"
        )
    items = _list("host_groups", groups)
    if not items:
        raise ValidationError("host_groups", "must list at least one group")
    hosts: list[Host] = []
    for g, raw in enumerate(items):
        where = f"host_groups[{g}]"
        group = _record(where, raw, _GROUP_KEYS)
        prefix = group["prefix"]
        if not isinstance(prefix, str):
            raise ValidationError(f"{where}.prefix", f"must be a string, got {prefix!r}")
        count = _positive_int(f"{where}.count", group["count"])
        gpus = _positive_int(f"{where}.gpus", group["gpus"])
        for i in range(count):
            host_id = f"{prefix}{i:04d}"
            if host_id in seen:
                raise ValidationError(
                    f"{where}.prefix", f"host {host_id!r} is also made by {seen[host_id]}"
                )
            seen[host_id] = where
            hosts.append(Host(id=host_id, gpus=gpus))
    return tuple(hosts)


def _named_hosts(value: object, seen: dict[str, str]) -> tuple[Host, ...]:
    """``hosts: [{id, gpus}]``: hosts kept under their own names (a live cluster's)."""
    if value is None:
        return ()
    hosts: list[Host] = []
    for h, raw in enumerate(_list("hosts", value)):
        where = f"hosts[{h}]"
        item = _record(where, raw, _HOST_KEYS)
        host_id = item["id"]
        if not isinstance(host_id, str) or not host_id:
            raise ValidationError(f"{where}.id", f"must be a non-empty string, got {host_id!r}")
        if host_id in seen:
            raise ValidationError(
                f"{where}.id", f"host {host_id!r} is also made by {seen[host_id]}"
            )
        seen[host_id] = where
        hosts.append(Host(id=host_id, gpus=_positive_int(f"{where}.gpus", item["gpus"])))
    if not hosts:
        raise ValidationError("hosts", "must list at least one host")
    return tuple(hosts)


def _partitions(value: object, hosts: tuple[Host, ...]) -> dict[str, tuple[str, ...]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError("partitions", f"must be a mapping team -> hosts, got {value!r}")
    counts: list[tuple[str, int]] = []
    for team, count in value.items():
        if not isinstance(team, str) or not team:
            raise ValidationError(
                f"partitions.{team}",
                "team names must be non-empty strings (quote them in YAML)",
            )
        counts.append((team, _positive_int(f"partitions.{team}", count, zero_ok=True)))
    total = sum(n for _, n in counts)
    if total > len(hosts):
        raise ValidationError(
            "partitions", f"assign {total} hosts but the cluster has only {len(hosts)}"
        )
    partitions: dict[str, tuple[str, ...]] = {}
    start = 0
    for team, n in counts:
        partitions[team] = tuple(host.id for host in hosts[start : start + n])
        start += n
    return partitions


def _health_events(value: object, host_ids: set[str]) -> tuple[HealthEvent, ...]:
    if value is None:
        return ()
    events: list[HealthEvent] = []
    for e, raw in enumerate(_list("health_events", value)):
        where = f"health_events[{e}]"
        item = _record(where, raw, _EVENT_KEYS)
        host = item["host"]
        if not isinstance(host, str) or host not in host_ids:
            raise ValidationError(f"{where}.host", f"unknown host {host!r}")
        time = item["time"]
        if (
            isinstance(time, bool)
            or not isinstance(time, int | float)
            or not math.isfinite(time)
            or time < 0
        ):
            raise ValidationError(
                f"{where}.time", f"must be a number of seconds >= 0, got {time!r}"
            )
        event = item["event"]
        if event not in HEALTH_EVENTS:
            raise ValidationError(
                f"{where}.event", f"must be one of {', '.join(HEALTH_EVENTS)}, got {event!r}"
            )
        events.append(HealthEvent(host=host, time=float(time), event=str(event)))
    events.sort(key=lambda ev: ev.time)  # stable: ties keep file order
    return tuple(events)
