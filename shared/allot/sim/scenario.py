"""Synthetic scenarios: an Ai2-like month, and the configs that go with the Philly trace.

``generate_ai2(seed, knobs) -> Scenario`` builds a cluster, a budget tree and a job trace;
``write_scenario(scenario, out_dir)`` writes them as ``cluster.yaml``, ``budgets.yaml`` and
``trace.csv`` (read back with ``allot.sim.cluster.load_cluster``, the budgets loader and
``allot.sim.trace.read_trace``). All randomness comes from one ``random.Random(seed)``,
drawn in a fixed order, so the same seed and knobs give byte-identical files.

The Ai2-like month (defaults in brackets, every one a field of ``Ai2Knobs``)
-----------------------------------------------------------------------------
* Cluster: ``hosts`` x ``gpus_per_host`` [48 x 8 = 384 GPUs], hosts ``node-0000`` ...
  ``host_failures`` [4] distinct hosts go unhealthy at a uniform time and are repaired
  2-48 h later (clipped to the month). ``partitions`` (for the partitioned baseline) deal
  the hosts to teams in proportion to their effective share (largest remainder, ties in
  tree order). The last ``short_lane`` [1] hosts form Fair Tree's short lane, as an
  operator keeps a debug partition (``allot.core.policy.Policy.short``).
* Budget tree: 15 teams under 4 programs with unequal integer shares (``TEAMS``):
  pretraining 40 (olmo-core 18, data-mix 9, scaling-laws 7, long-context 6),
  post-training 25 (tulu-sft 9, rlhf 8, safety 5, evals 3), multimodal 20 (molmo 11,
  vision-data 5, embodied 4), applied-science 15 (semantic-scholar 5, climate 4,
  biomed 3, code-agents 3). A team's effective share is
  ``program/sum(programs) * team/sum(teams in program)``.
* Demand: total requested GPU-hours (``sum gpus * duration_s / 3600`` over every job,
  fillers included) = ``demand_factor`` [2.5] x capacity GPU-hours
  (``hosts * gpus_per_host * 24 * days`` [30]). Each team's slice is proportional to
  ``effective share * J`` with ``J`` log-uniform in [1/2, 2] (so some teams want more
  than their share and some less), then split over the job classes below by GPU-hours.
  For each (team, class) jobs are drawn until the slice is spent (a job is kept while
  the running total plus half of it stays within the slice, so the expected total is the
  slice). The arrival rate is therefore ``slice / (mean job GPU-hours * month)``.
* Seasonality: each team alternates busy and quiet phases (first phase a coin flip;
  busy lasts ``busy_days`` [3-10] days, quiet ``quiet_days`` [2-7] days; arrival
  intensity 1 when busy, ``quiet_level`` [0.1] when quiet), so a team's demand falls
  below its share for days at a time. Debug, interactive and eval submissions also follow
  office hours (x1 from 09:00 to 19:00, x0.25 otherwise, x0.4 on the 6th and 7th day of
  each week). Fillers ignore phases and hours: they are a steady background. Submit times are
  drawn from the resulting hourly intensity, then uniformly inside the hour.
* Job classes, by share of requested GPU-hours (knob), GPUs (uniform over the list),
  duration, min_runtime (uniform, whole minutes), resumable:

      kind         GPU-h share (knob)       GPUs            duration        min_run    res.
      debug        0.8% debug_fraction      1 (70%), 2      5-30 min uni.   5-15 min   no
      interactive  8% interactive_fraction  1, 1, 2, 4, 8   1-8 h log-u.    1-2 h      no
      eval         6% eval_fraction         1, 2, 4, 8      0.5-3 h log-u.  30-60 min  yes
      training     the rest (20.2%)         8, 8, 16, 16,   6-48 h log-u.   2-4 h      yes
                                            32, 64
      filler       65% filler_fraction      1, 2, 4, 8      1-24 h log-u.   0          yes

  Teams of the ``pretraining`` and ``multimodal`` programs put ``gang_fraction`` [0.3]
  of their training GPU-hours into multi-host gangs of 64 (2/3) or 128 (1/3) GPUs; with
  ``max_gang`` [None] every team does, gangs up to that size whatever its entitlement.
  No job asks for more than ``max_job_entitlement_ratio`` [2] x its team's entitlement
  (effective share x GPUs, at least 8): sizes above the cap are not drawn, and teams
  whose cap is under 64 GPUs run no gangs (with the defaults olmo-core runs 64 and 128,
  molmo and data-mix 64). A team does not launch a run several times its budget on a
  cluster whose demand is 2.5x capacity; the seeds' "capacity fragmentation" worry is
  what such runs would cause.
  Fillers carry their team's allocation but ``min_runtime_s = 0``: unallocated,
  never charged, preemptible by any allocated request. min_runtime is rounded to the
  minute and never above 8 h. Users: each team has 6-14 users (``<team>-uNN``).
* Legacy columns (for the ``priority`` baseline, showing the seeds' priority inflation):
  ``legacy_class`` is HIGH with probability ``legacy_high_fraction`` [0.8], else NORMAL
  (3/4) or LOW (1/4); fillers are LOW 60%, NORMAL 30%, HIGH 10%. ``legacy_protected``
  (opted out of preemption) with probability interactive 0.9, training 0.6, eval 0.3,
  debug 0.2, filler 0.

Why most of the demand is unallocated: the seeds report 2-3x demand *and* 18% of
delivered time unallocated, so much of what waits is free, preemptible work (sweeps,
opportunistic jobs), and funded demand is near capacity, above it in bursts. With
``filler_fraction`` 0.65, funded demand is about 0.9x capacity on average (bursty teams
take it above capacity for days) and unallocated demand about 1.6x; a month then delivers
on the order of the seeds' unallocated share. With 0.2 (funded demand 2x capacity) every
team is short all month: the owed metric then mostly measures an impossible target.

Use ``allot scenario ai2 --seed N --out DIR`` and count the kinds in trace.csv for the
exact mix of a seed (about 40,000 jobs a month with the defaults).

Philly configs
--------------
``philly_budgets(vc_csv, trace_teams)`` is a flat tree: one leaf per VC of the Helios
node-count file with ``shares`` = its node count, plus ``shares: 1`` for each trace team
the file lacks. ``philly_cluster(vc_csv, trace_teams, hosts=352, gpus=8)`` is one host
group and ``partitions`` = the node counts; the VCs the file lacks get 0 hosts, so under
the partitioned baseline their jobs (18 jobs, about 177 GPU-hours) wait for ever and show
up as never started. 352 is the sum of the 11 VCs' nodes.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from allot.core.budgets import PARENT
from allot.core.errors import ValidationError
from allot.core.model import MAX_MIN_RUNTIME_S, Workload
from allot.sim.input_files import csv_rows
from allot.sim.output_files import csv_number
from allot.sim.trace import TraceJob

HOUR = 3600
DAY = 86400

TEAMS: tuple[tuple[str, int, tuple[tuple[str, int], ...]], ...] = (
    (
        "pretraining",
        40,
        (("olmo-core", 18), ("data-mix", 9), ("scaling-laws", 7), ("long-context", 6)),
    ),
    ("post-training", 25, (("tulu-sft", 9), ("rlhf", 8), ("safety", 5), ("evals", 3))),
    ("multimodal", 20, (("molmo", 11), ("vision-data", 5), ("embodied", 4))),
    (
        "applied-science",
        15,
        (("semantic-scholar", 5), ("climate", 4), ("biomed", 3), ("code-agents", 3)),
    ),
)
"""(program, shares, ((team, shares), ...)): the default budget tree."""

GANG_PROGRAMS = frozenset({"pretraining", "multimodal"})
KINDS = ("debug", "interactive", "eval", "training", "filler")
TRACE_COLUMNS = (
    "job_id",
    "submit_time_s",
    "gpus",
    "duration_s",
    "allocation",
    "user",
    "kind",
    "min_runtime_s",
    "resumable",
    "legacy_class",
    "legacy_protected",
)
_PROTECTED_P = {"debug": 0.2, "interactive": 0.9, "eval": 0.3, "training": 0.6, "filler": 0.0}
_OFFICE_KINDS = frozenset({"debug", "interactive", "eval"})


@dataclass(frozen=True, slots=True)
class Ai2Knobs:
    """The scenario's knobs; see the module docstring for what each one shapes."""

    days: int = 30
    hosts: int = 48
    gpus_per_host: int = 8
    demand_factor: float = 2.5
    debug_fraction: float = 0.008
    interactive_fraction: float = 0.08
    eval_fraction: float = 0.06
    filler_fraction: float = 0.65
    gang_fraction: float = 0.3
    # A run asks for at most this multiple of its team's entitlement (effective share x
    # GPUs; never less than one host); teams whose cap is under 64 GPUs run no gangs.
    max_job_entitlement_ratio: float = 2.0
    busy_days: tuple[float, float] = (3.0, 10.0)
    quiet_days: tuple[float, float] = (2.0, 7.0)
    quiet_level: float = 0.1
    host_failures: int = 4
    legacy_high_fraction: float = 0.8
    max_gang: int | None = None
    """Gangs of up to this many GPUs from every team, whatever its entitlement (None: the
    programs above, capped by their entitlement): the fragmentation stress of issue 37."""
    short_lane: int = 1
    """The cluster's last hosts that form Fair Tree's short lane (``allot.sim.cluster``),
    as an operator would keep a debug partition; 0: none."""

    def __post_init__(self) -> None:
        for name in ("days", "hosts", "gpus_per_host"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValidationError(f"knobs.{name}", f"must be a positive integer, got {value}")
        # Infinite demand would draw jobs forever (and NaN compares false to everything).
        if not 0 < self.demand_factor < math.inf:
            raise ValidationError(
                "knobs.demand_factor", f"must be > 0 and finite, got {self.demand_factor}"
            )
        fractions = ("debug_fraction", "interactive_fraction", "eval_fraction", "filler_fraction")
        for name in (*fractions, "gang_fraction", "quiet_level", "legacy_high_fraction"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValidationError(f"knobs.{name}", f"must be in [0, 1], got {value}")
        if sum(getattr(self, name) for name in fractions) >= 1:
            raise ValidationError(
                "knobs", f"{' + '.join(fractions)} must leave room for training (sum < 1)"
            )
        for name in ("busy_days", "quiet_days"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValidationError(f"knobs.{name}", f"must be 0 < low <= high, got {low, high}")
        capacity = self.hosts * self.gpus_per_host
        if self.max_gang is not None and (
            isinstance(self.max_gang, bool)
            or not isinstance(self.max_gang, int)
            or not 64 <= self.max_gang <= capacity
        ):
            raise ValidationError(
                "knobs.max_gang",
                f"must be a whole number of GPUs from 64 (the smallest gang) to the cluster's "
                f"{capacity}, got {self.max_gang!r}",
            )
        if isinstance(self.short_lane, bool) or not (
            isinstance(self.short_lane, int) and 0 <= self.short_lane < self.hosts
        ):
            raise ValidationError(
                "knobs.short_lane",
                f"must be a whole number of hosts from 0 to hosts - 1, got {self.short_lane!r}",
            )
        if not 0 <= self.host_failures <= self.hosts:
            raise ValidationError(
                "knobs.host_failures", f"must be in [0, hosts], got {self.host_failures}"
            )

    @property
    def capacity_gpu_h(self) -> float:
        return float(self.hosts * self.gpus_per_host * 24 * self.days)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A generated scenario: the loaded forms of its three files."""

    seed: int
    knobs: Ai2Knobs
    cluster: dict[str, object]
    budgets: dict[str, object]
    jobs: tuple[TraceJob, ...] = field(default=())

    @property
    def requested_gpu_h(self) -> float:
        return sum(job.workload.gpus * job.duration_s for job in self.jobs) / HOUR


def generate_ai2(seed: int, knobs: Ai2Knobs = Ai2Knobs()) -> Scenario:
    """An Ai2-like month (see the module docstring). Same seed and knobs: same scenario."""
    rng = random.Random(seed)
    shares = _effective_shares()
    teams = list(shares)
    program_of = {team: program for program, _, members in TEAMS for team, _ in members}

    jitter = {team: math.exp(rng.uniform(math.log(0.5), math.log(2.0))) for team in teams}
    weight_sum = sum(shares[team] * jitter[team] for team in teams)
    total = knobs.demand_factor * knobs.capacity_gpu_h
    class_fraction = {
        "debug": knobs.debug_fraction,
        "interactive": knobs.interactive_fraction,
        "eval": knobs.eval_fraction,
        "filler": knobs.filler_fraction,
    }
    class_fraction["training"] = 1.0 - sum(class_fraction.values())

    hours = knobs.days * 24
    office = _office_profile(hours)
    drafts: list[tuple[int, int, int, int, _Draft]] = []  # (submit, team#, kind#, seq, job)
    for t_index, team in enumerate(teams):
        users = [f"{team}-u{k:02d}" for k in range(rng.randint(6, 14))]
        phases = _phase_profile(rng, hours, knobs)
        flat = [1.0] * hours
        slice_gpu_h = total * shares[team] * jitter[team] / weight_sum
        entitlement = shares[team] * knobs.hosts * knobs.gpus_per_host
        max_gpus = max(8, math.floor(knobs.max_job_entitlement_ratio * entitlement))
        for k_index, kind in enumerate(KINDS):
            budget = slice_gpu_h * class_fraction[kind]
            jobs: list[_Draft] = []
            if knobs.max_gang is None:
                gang_cap = max_gpus
                gangs = program_of[team] in GANG_PROGRAMS and max_gpus >= 64
            else:  # every team, up to the knob, whatever its entitlement
                gang_cap, gangs = knobs.max_gang, True
            if kind == "training" and gangs:
                jobs += _draw_jobs(rng, "gang", budget * knobs.gang_fraction, gang_cap)
                budget *= 1.0 - knobs.gang_fraction
            jobs += _draw_jobs(rng, kind, budget, max_gpus)
            if kind == "filler":
                intensity = flat
            elif kind in _OFFICE_KINDS:
                intensity = [p * o for p, o in zip(phases, office, strict=True)]
            else:
                intensity = phases
            cum = _cumulative(intensity)
            starts = rng.choices(range(hours), cum_weights=cum, k=len(jobs))
            for seq, (job, hour) in enumerate(zip(jobs, starts, strict=True)):
                submit = hour * HOUR + rng.randrange(HOUR)
                job.user = users[rng.randrange(len(users))]
                job.legacy_class = _legacy_class(rng, kind, knobs.legacy_high_fraction)
                job.legacy_protected = rng.random() < _PROTECTED_P[kind]
                drafts.append((submit, t_index, k_index, seq, job))

    drafts.sort(key=lambda d: d[:4])
    trace = tuple(
        TraceJob(
            workload=Workload(
                id=f"ai2-{n:06d}",
                allocation=teams[t_index],
                user=job.user,
                gpus=job.gpus,
                min_runtime_s=job.min_runtime_s,
                resumable=job.resumable,
                kind=job.kind,
                submit_time=float(submit),
            ),
            duration_s=float(job.duration_s),
            legacy_class=job.legacy_class,
            legacy_protected=job.legacy_protected,
        )
        for n, (submit, t_index, _, _, job) in enumerate(drafts)
    )
    cluster = _ai2_cluster(rng, knobs, shares)
    return Scenario(seed=seed, knobs=knobs, cluster=cluster, budgets=_ai2_budgets(), jobs=trace)


SCENARIO_FILE = "scenario.json"
"""Beside the trace: which scenario and seed made it (``allot simulate`` carries it into the
report)."""


def write_scenario(scenario: Scenario, out_dir: Path) -> None:
    """Write ``cluster.yaml``, ``budgets.yaml``, ``trace.csv`` and ``scenario.json`` (its
    name, seed and knobs) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(out_dir / "cluster.yaml", dump_cluster_yaml(scenario.cluster))
    _write(out_dir / "budgets.yaml", dump_budgets_yaml(scenario.budgets))
    _write(out_dir / "trace.csv", dump_trace_csv(scenario.jobs))
    made = {"name": "ai2", "seed": scenario.seed, "knobs": dataclasses.asdict(scenario.knobs)}
    _write(out_dir / SCENARIO_FILE, json.dumps(made, sort_keys=True, indent=2) + "\n")


def scenario_of(trace: Path) -> dict[str, object] | None:
    """The ``scenario.json`` beside ``trace`` (name and seed), or None when there is none or
    it is unreadable (a trace from elsewhere)."""
    try:
        made = json.loads((trace.parent / SCENARIO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(made, dict) or "seed" not in made:
        return None
    return {"name": str(made.get("name", "?")), "seed": made["seed"]}


def dump_trace_csv(jobs: Iterable[TraceJob]) -> str:
    """The CSV text ``read_trace`` reads back into the same jobs (``TRACE_COLUMNS``)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(TRACE_COLUMNS)
    for job in jobs:
        w = job.workload
        writer.writerow(
            (
                w.id,
                csv_number(w.submit_time),
                w.gpus,
                csv_number(job.duration_s),
                w.allocation or "",
                w.user,
                w.kind,
                w.min_runtime_s,
                "true" if w.resumable else "false",
                job.legacy_class,
                "true" if job.legacy_protected else "false",
            )
        )
    return buffer.getvalue()


def dump_budgets_yaml(tree: Mapping[str, object]) -> str:
    """A budget tree ``{name, shares?, children?}`` as block YAML with quoted names;
    leaves inside a ``children`` list are written as one-line flow mappings."""
    lines: list[str] = []
    _budget_node(tree, "", lines, in_list=False)
    return "\n".join(lines) + "\n"


def dump_cluster_yaml(cluster: Mapping[str, object]) -> str:
    """A cluster dict (see ``allot.sim.cluster``) as YAML with quoted names, keys in the
    order name, host_groups, hosts, partitions, short_lane, health_events."""
    lines: list[str] = []
    if "name" in cluster:
        lines.append(f"name: {_q(cluster['name'])}")
    if "host_groups" in cluster or "hosts" not in cluster:  # named hosts alone need none
        lines.append("host_groups:")
        for group in _seq(cluster.get("host_groups")):
            g = _map(group)
            lines.append(
                f"  - {{prefix: {_q(g['prefix'])}, count: {_scalar(g['count'])}, "
                f"gpus: {_scalar(g['gpus'])}}}"
            )
    if "hosts" in cluster:
        lines.append("hosts:")
        for host in _seq(cluster.get("hosts")):
            h = _map(host)
            lines.append(f"  - {{id: {_q(h['id'])}, gpus: {_scalar(h['gpus'])}}}")
    partitions = cluster.get("partitions")
    if partitions:
        lines.append("partitions:")
        lines.extend(f"  {_q(team)}: {_scalar(n)}" for team, n in _map(partitions).items())
    if cluster.get("short_lane"):
        lines.append(f"short_lane: {_scalar(cluster['short_lane'])}")
    events = cluster.get("health_events")
    if events:
        lines.append("health_events:")
        for event in _seq(events):
            e = _map(event)
            lines.append(
                f"  - {{host: {_q(e['host'])}, time: {_scalar(e['time'])}, "
                f"event: {_q(e['event'])}}}"
            )
    return "\n".join(lines) + "\n"


def philly_budgets(vc_csv: Path, trace_teams: Iterable[str]) -> dict[str, object]:
    """Flat budget tree: each VC's shares = its node count; trace teams the file lacks get
    ``shares: 1`` (appended in sorted order)."""
    nodes = _vc_nodes(vc_csv)
    children: list[dict[str, object]] = [
        {"name": vc, "shares": count} for vc, count in nodes.items()
    ]
    children += [{"name": team, "shares": 1} for team in sorted(set(trace_teams) - set(nodes))]
    return {"name": "root", "children": children}


def philly_cluster(
    vc_csv: Path, trace_teams: Iterable[str] = (), hosts: int = 352, gpus: int = 8
) -> dict[str, object]:
    """One host group of ``hosts`` x ``gpus`` and partitions = the VC node counts; trace
    teams the file lacks get 0 hosts (their jobs wait for ever under the partitioned
    baseline)."""
    nodes = _vc_nodes(vc_csv)
    if sum(nodes.values()) > hosts:
        raise ValidationError(
            "hosts", f"the VCs hold {sum(nodes.values())} nodes but hosts is {hosts}"
        )
    partitions: dict[str, int] = dict(nodes)
    partitions.update(dict.fromkeys(sorted(set(trace_teams) - set(nodes)), 0))
    return {
        "name": "philly",
        "host_groups": [{"prefix": "philly-", "count": hosts, "gpus": gpus}],
        "partitions": partitions,
    }


# --- the Ai2-like generator's pieces -------------------------------------------------


@dataclass(slots=True)
class _Draft:
    kind: str
    gpus: int
    duration_s: int
    min_runtime_s: int
    resumable: bool
    user: str = ""
    legacy_class: str = "NORMAL"
    legacy_protected: bool = False


def _effective_shares() -> dict[str, float]:
    program_total = sum(shares for _, shares, _ in TEAMS)
    out: dict[str, float] = {}
    for _, program_shares, members in TEAMS:
        team_total = sum(shares for _, shares in members)
        for team, shares in members:
            out[team] = program_shares / program_total * shares / team_total
    return out


def _ai2_budgets() -> dict[str, object]:
    return {
        "name": "root",
        "children": [
            {
                "name": program,
                "shares": shares,
                "children": [{"name": team, "shares": s} for team, s in members],
            }
            for program, shares, members in TEAMS
        ],
    }


def _ai2_cluster(
    rng: random.Random, knobs: Ai2Knobs, shares: dict[str, float]
) -> dict[str, object]:
    span = knobs.days * DAY
    events: list[tuple[int, int, str, str]] = []
    for host in sorted(rng.sample(range(knobs.hosts), knobs.host_failures)):
        down = rng.randrange(span)
        up = down + rng.randint(2 * HOUR, 48 * HOUR)
        name = f"node-{host:04d}"
        events.append((down, 0, name, "unhealthy"))
        if up < span:
            events.append((up, 1, name, "repaired"))
    events.sort()
    return {
        "name": "ai2-like",
        "host_groups": [{"prefix": "node-", "count": knobs.hosts, "gpus": knobs.gpus_per_host}],
        "partitions": _largest_remainder(shares, knobs.hosts),
        **({"short_lane": knobs.short_lane} if knobs.short_lane else {}),
        "health_events": [{"host": h, "time": t, "event": e} for t, _, h, e in events],
    }


def _largest_remainder(shares: Mapping[str, float], seats: int) -> dict[str, int]:
    """Hamilton apportionment: floors, then one more seat to the largest remainders (ties
    in the mapping's order)."""
    quotas = {team: share * seats for team, share in shares.items()}
    out = {team: math.floor(q) for team, q in quotas.items()}
    order = sorted(quotas, key=lambda team: -(quotas[team] - out[team]))  # stable on ties
    for team in order[: seats - sum(out.values())]:
        out[team] += 1
    return out


def _phase_profile(rng: random.Random, hours: int, knobs: Ai2Knobs) -> list[float]:
    """Hourly arrival intensity of one team: busy (1.0) and quiet (quiet_level) phases."""
    out: list[float] = []
    busy = rng.random() < 0.5
    while len(out) < hours:
        low, high = knobs.busy_days if busy else knobs.quiet_days
        length = max(1, round(rng.uniform(low, high) * 24))
        out += [1.0 if busy else knobs.quiet_level] * length
        busy = not busy
    return out[:hours]


def _office_profile(hours: int) -> list[float]:
    """x1 09:00-19:00, x0.25 otherwise; x0.4 on the 6th and 7th day of each week."""
    out: list[float] = []
    for h in range(hours):
        factor = 1.0 if 9 <= h % 24 < 19 else 0.25
        if (h // 24) % 7 >= 5:
            factor *= 0.4
        out.append(factor)
    return out


def _cumulative(weights: Sequence[float]) -> list[float]:
    out: list[float] = []
    acc = 0.0
    for w in weights:
        acc += w
        out.append(acc)
    if acc <= 0:  # pragma: no cover - quiet_level 0 and office hours still leave busy hours
        return [float(i + 1) for i in range(len(weights))]
    return out


def _draw_jobs(rng: random.Random, kind: str, budget_gpu_h: float, max_gpus: int) -> list[_Draft]:
    """Draw jobs of ``kind`` until ``budget_gpu_h`` is spent: a job is kept while the
    running total plus half of it stays within the budget."""
    jobs: list[_Draft] = []
    spent = 0.0
    while True:
        job = _draw_one(rng, kind, max_gpus)
        gpu_h = job.gpus * job.duration_s / HOUR
        if spent + gpu_h / 2 > budget_gpu_h:
            return jobs
        spent += gpu_h
        jobs.append(job)


def _log_uniform(rng: random.Random, low: float, high: float) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def _minutes(rng: random.Random, low_min: int, high_min: int) -> int:
    return min(rng.randint(low_min, high_min) * 60, MAX_MIN_RUNTIME_S)


def _sized(rng: random.Random, choices: tuple[int, ...], max_gpus: int) -> int:
    """One of ``choices`` no larger than ``max_gpus`` (the smallest choice if none is)."""
    allowed = tuple(g for g in choices if g <= max_gpus) or (min(choices),)
    return rng.choice(allowed)


def _draw_one(rng: random.Random, kind: str, max_gpus: int) -> _Draft:
    if kind == "debug":
        gpus = 1 if rng.random() < 0.7 else 2
        return _Draft("debug", gpus, rng.randint(5 * 60, 30 * 60), _minutes(rng, 5, 15), False)
    if kind == "interactive":
        gpus = rng.choice((1, 1, 2, 4, 8))
        duration = _log_uniform(rng, 1 * HOUR, 8 * HOUR)
        return _Draft("interactive", gpus, duration, _minutes(rng, 60, 120), False)
    if kind == "eval":
        gpus = rng.choice((1, 2, 4, 8))
        duration = _log_uniform(rng, HOUR / 2, 3 * HOUR)
        return _Draft("eval", gpus, duration, _minutes(rng, 30, 60), True)
    if kind == "training":
        gpus = _sized(rng, (8, 8, 16, 16, 32, 64), max_gpus)
        duration = _log_uniform(rng, 6 * HOUR, 48 * HOUR)
        return _Draft("training", gpus, duration, _minutes(rng, 120, 240), True)
    if kind == "gang":
        gpus = _sized(rng, (64, 64, 128), max_gpus)
        duration = _log_uniform(rng, 6 * HOUR, 48 * HOUR)
        return _Draft("training", gpus, duration, _minutes(rng, 120, 240), True)
    if kind == "filler":
        gpus = rng.choice((1, 2, 4, 8))
        duration = _log_uniform(rng, HOUR, 24 * HOUR)
        return _Draft("filler", gpus, duration, 0, True)
    raise ValidationError("kind", f"unknown job class {kind!r}")  # pragma: no cover


def _legacy_class(rng: random.Random, kind: str, high_fraction: float) -> str:
    u = rng.random()
    if kind == "filler":
        return "LOW" if u < 0.6 else "NORMAL" if u < 0.9 else "HIGH"
    if u < high_fraction:
        return "HIGH"
    return "NORMAL" if u < high_fraction + (1 - high_fraction) * 0.75 else "LOW"


# --- Philly helpers -------------------------------------------------------------------


def _vc_nodes(vc_csv: Path) -> dict[str, int]:
    """``vc,node num`` rows -> {vc: nodes}, in file order."""
    out: dict[str, int] = {}
    with csv_rows(vc_csv) as reader:
        header = [h.strip() for h in next(reader, [])]
        if header[:2] != ["vc", "node num"]:
            raise ValidationError(f"{vc_csv}:1", f"expected header 'vc,node num', got {header}")
        for row in reader:
            if not row:
                continue
            where = f"{vc_csv}:{reader.line_num}"
            vc = row[0].strip()
            try:
                count = int(row[1])
            except (IndexError, ValueError):
                raise ValidationError(f"{where}: node num", f"not an integer: {row}") from None
            if not vc or count <= 0 or vc in out:
                raise ValidationError(where, f"need a new VC name and nodes > 0, got {row}")
            out[vc] = count
    return out


# --- tiny YAML/CSV writers (fixed shapes, byte-stable) ----------------------------------


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8", newline="\n")


def _q(value: object) -> str:
    """A YAML double-quoted scalar (JSON string syntax is valid YAML)."""
    return json.dumps(str(value))


def _scalar(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError("yaml", f"expected a number, got {value!r}")
    return csv_number(value)


def _map(value: object) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ValidationError("yaml", f"expected a mapping, got {value!r}")
    return value


def _seq(value: object) -> Sequence[object]:
    if not isinstance(value, list | tuple):
        raise ValidationError("yaml", f"expected a list, got {value!r}")
    return value


def _budget_node(node: object, indent: str, lines: list[str], *, in_list: bool) -> None:
    n = _map(node)
    children = n.get("children")
    fields = [f"name: {_q(n['name'])}"]
    if "shares" in n:
        shares = n["shares"]  # Slurm's ``parent`` stays a word; numbers are numbers
        fields.append(f"shares: {PARENT if shares == PARENT else _scalar(shares)}")
    if in_list and not children:
        lines.append(f"{indent}- {{{', '.join(fields)}}}")
        return
    lead = f"{indent}- " if in_list else indent
    inner = f"{indent}  " if in_list else indent
    lines.append(f"{lead}{fields[0]}")
    lines.extend(f"{inner}{f}" for f in fields[1:])
    if children:
        lines.append(f"{inner}children:")
        for child in _seq(children):
            _budget_node(child, inner + "  ", lines, in_list=True)
