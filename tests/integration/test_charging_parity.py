"""The simulator and the accounting service charge the same GPU-seconds (issue 35).

Both charge through ``allot.core.usage`` (decision 0007); this test checks that they agree
on what they are given. Each case is a small cluster and trace:

1. The simulator runs it (``simulate``) and charges as it goes: ``SimRecord.usage``, hourly
   GPU-seconds per allocation.
2. The log a live cluster writes for the same runs, a ``WorkloadStarted`` and a terminal
   record (``WorkloadCompleted``, or ``WorkloadPreempted`` for an attempt cut short) per
   segment of the record, encoded and decoded as the service decodes them, is read by the
   accounting service's ``Charger`` against a real Redis (tests/conftest.py), in the order
   it is read: its live window accrues every ``accrue_s`` and each record is read
   ``start_delay_s`` / ``end_delay_s`` after its time (a late end finds slots charged
   whole by the window, and settles them).
3. Per allocation and per hour, Redis holds what the simulator charged; and both hold the
   allocated GPU-seconds of the record's segments (the third witness).

Times are multiples of 0.25 s and GPU counts small integers, so every piece and every sum is
exact in binary floating point: buckets are compared with ``==``.
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import msgspec
import pytest
import redis.asyncio as redis_asyncio

from allot import bus
from allot.core.budgets import BudgetTree, parse_tree
from allot.core.model import Host, Workload
from allot.core.usage import HOUR_S
from allot.proto import codec
from allot.proto import messages as m
from allot.services.accounting import Charger, oldest_charged
from allot.sim.baselines import named_policy
from allot.sim.cluster import ClusterSpec, load_cluster
from allot.sim.engine import SimConfig, simulate
from allot.sim.record import SimRecord
from allot.sim.scenario import Ai2Knobs, generate_ai2
from allot.sim.trace import TraceJob

pytestmark = pytest.mark.integration

T0 = 472_222 * HOUR_S  # 1_699_999_200: an hour boundary
YEAR = 365 * 86_400.0
TREE = parse_tree(
    {"name": "root", "children": [{"name": "alpha", "shares": 1}, {"name": "beta", "shares": 1}]}
)

Buckets = dict[str, dict[int, float]]


# -- builders ------------------------------------------------------------------------------------


def job(
    wid: str,
    allocation: str | None,
    gpus: int,
    submit: float,
    duration: float,
    *,
    min_runtime_s: int = 1800,
) -> TraceJob:
    """A trace job submitted ``submit`` seconds after ``T0``; ``min_runtime_s=0`` or no
    allocation makes it unallocated (free)."""
    w = Workload(wid, allocation, "u", gpus, min_runtime_s, submit_time=T0 + submit)
    return TraceJob(w, duration_s=duration)


def free(
    wid: str, gpus: int, submit: float, duration: float, allocation: str | None = None
) -> TraceJob:
    return job(wid, allocation, gpus, submit, duration, min_runtime_s=0)


def hosts(n: int, gpus: int = 8) -> tuple[Host, ...]:
    return tuple(Host(f"node-{i}", gpus) for i in range(n))


@dataclass(frozen=True)
class Forged:
    """Log records that are not the runs the simulator saw."""

    claims_s: float = 0.0
    """Every terminal record claims its run started this much earlier and ended this much
    later than it did (a forged or skewed clock)."""
    free_runs: tuple[tuple[str, str, float, float, int], ...] = ()
    """(workload, allocation, start, end, gpus), seconds after ``T0``: allocated runs the
    simulator never ran: a zero-length one, or one whose end comes before its start."""


@dataclass(frozen=True)
class Case:
    jobs: tuple[TraceJob, ...]
    cluster: ClusterSpec = field(default_factory=lambda: ClusterSpec(hosts(2)))
    tree: BudgetTree = TREE
    policy: str = "fairshare"
    grace_s: int = 300
    slot_s: float = 60.0
    accrue_s: float = 30.0
    start_delay_s: float = 0.0
    end_delay_s: float = 0.0
    forged: Forged = Forged()


MIXED = (
    job("alpha-1", "alpha", 4, 3000.25, 1234.5),  # crosses T0 + 1 h
    job("alpha-2", "alpha", 2, 0.0, 3 * HOUR_S + 17.75),  # three hours and a bit
    job("beta-1", "beta", 3, 59.5, 61.0),  # two slots, barely
    job("beta-2", "beta", 1, 7200.0, 60.0),  # one slot, on the grid
    job("beta-3", "beta", 2, 7230.0, 0.25),  # a quarter second
    free("filler", 1, 100.0, 5000.0, "alpha"),  # unallocated, though it names alpha
)

CASES = {
    "one-run-across-an-hour": Case(jobs=(job("a", "alpha", 4, 3000.25, 1234.5),)),
    "runs-across-slots-and-hours": Case(jobs=MIXED),
    "ends-read-late-after-the-live-window-charged-past-them": Case(jobs=MIXED, end_delay_s=150.0),
    "a-start-read-after-its-end": Case(jobs=MIXED, start_delay_s=4 * HOUR_S, end_delay_s=30.0),
    "a-grid-of-7-s-whose-slots-straddle-hours": Case(
        jobs=MIXED, slot_s=7.0, accrue_s=5.0, end_delay_s=20.0
    ),
    "a-grid-of-an-hour-ends-read-hours-late": Case(
        jobs=MIXED, slot_s=3600.0, accrue_s=600.0, end_delay_s=3.5 * HOUR_S
    ),
    "unallocated-work-preempted-by-allocated-work-is-never-charged": Case(
        cluster=ClusterSpec(hosts(1)),
        jobs=(
            free("free-big", 8, 0.0, 4000.0),
            free("free-named", 4, 10.0, 900.0, "beta"),
            job("alpha-late", "alpha", 6, 600.0, 1800.0),
        ),
        end_delay_s=45.0,
    ),
    "a-reclaim-preempts-allocated-work-each-attempt-charged-to-its-deadline": Case(
        jobs=(
            job("alpha-six", "alpha", 6, 0.0, 20_000.0),
            job("beta-big", "beta", 8, 0.0, 20_000.0),
            job("beta-mid", "beta", 4, 0.0, 20_000.0),
            job("beta-small", "beta", 2, 0.0, 20_000.0),
            job("alpha-two", "alpha", 2, 600.0, 20_000.0),
        ),
        end_delay_s=90.0,
    ),
    "forged-records-claiming-a-year-more-on-both-sides-read-at-the-true-end": Case(
        jobs=MIXED, forged=Forged(claims_s=YEAR)
    ),
    "zero-length-runs-and-an-end-before-its-start-are-charged-nothing": Case(
        jobs=MIXED,
        end_delay_s=150.0,
        forged=Forged(
            free_runs=(
                ("instant", "alpha", 1000.0, 1000.0, 4),
                ("instant-on-the-grid", "beta", 3600.0, 3600.0, 2),
                ("backwards", "beta", 2000.0, 1000.0, 2),
            )
        ),
    ),
    "a-run-longer-than-the-store-keeps": Case(
        jobs=(job("nine-days", "alpha", 2, 30.0, 9 * 86_400.0 + 0.5),),
        accrue_s=HOUR_S,
    ),
}


# -- the two sides -------------------------------------------------------------------------------


def run_simulator(case: Case) -> SimRecord:
    policy = named_policy(case.policy, case.tree, case.cluster.total_gpus, case.grace_s)
    return simulate(case.cluster, case.tree, case.jobs, SimConfig(case.policy, policy))


@dataclass(frozen=True)
class Read:
    at: float
    """When accounting reads the record."""
    record: msgspec.Struct


@dataclass(frozen=True)
class Run:
    """One attempt of a workload as the log tells it."""

    workload_id: str
    attempt: int
    allocation: str | None
    allocated: bool
    gpus: int
    start: float
    end: float

    def started(self) -> m.WorkloadStarted:
        return m.WorkloadStarted(
            workload_id=self.workload_id,
            allocation=self.allocation,
            at=self.start,
            host="node-0",
            attempt=self.attempt,
            gpus=self.gpus,
            allocated=self.allocated,
        )

    def ended(self, *, preempted: bool, claims_s: float = 0.0) -> msgspec.Struct:
        """Its terminal record, claiming ``claims_s`` more on both sides."""
        if preempted:
            return m.WorkloadPreempted(
                workload_id=self.workload_id,
                allocation=self.allocation,
                at=self.end + claims_s,
                reason="reclaimed-for-entitlement",
                attempt=self.attempt,
                gpus=self.gpus,
                started_at=self.start - claims_s,
                allocated=self.allocated,
            )
        return m.WorkloadCompleted(
            workload_id=self.workload_id,
            allocation=self.allocation,
            at=self.end + claims_s,
            attempt=self.attempt,
            gpus=self.gpus,
            started_at=self.start - claims_s,
            allocated=self.allocated,
        )


def log_of(record: SimRecord, case: Case) -> list[Read]:
    """The records a live cluster writes for the record's segments, each with when it is
    read; a workload's attempts are numbered by their starts."""
    final_state = {j.workload_id: j.state for j in record.jobs}
    segments = sorted(record.segments, key=lambda s: (s.start, s.workload_id))
    last = {s.workload_id: s for s in segments}
    attempts: Counter[str] = Counter()
    reads: list[Read] = []
    for seg in segments:
        attempts[seg.workload_id] += 1
        run = Run(
            seg.workload_id,
            attempts[seg.workload_id],
            seg.allocation,
            seg.allocated,
            seg.gpus,
            seg.start,
            seg.end,
        )
        completed = seg is last[seg.workload_id] and final_state[seg.workload_id] == "completed"
        reads += [
            Read(seg.start + case.start_delay_s, run.started()),
            Read(
                seg.end + case.end_delay_s,
                run.ended(preempted=not completed, claims_s=case.forged.claims_s),
            ),
        ]
    for wid, allocation, start, end, gpus in case.forged.free_runs:
        run = Run(wid, 1, allocation, True, gpus, T0 + start, T0 + end)
        reads += [
            Read(run.start, run.started()),
            Read(max(run.start, run.end) + case.end_delay_s, run.ended(preempted=False)),
        ]
    return sorted(reads, key=lambda r: r.at)


def over_the_wire(record: msgspec.Struct) -> msgspec.Struct:
    """The record as the service decodes it from the log."""
    subject = bus.event_subject(getattr(record, "allocation"), record)  # noqa: B009
    return bus.decode_record(subject, codec.encode(record))


async def run_accounting(
    client: redis_asyncio.Redis, prefix: str, case: Case, reads: Sequence[Read]
) -> tuple[Buckets, float]:
    """Feed ``reads`` to a ``Charger`` on its own clock, the live window accruing every
    ``accrue_s`` in between; every bucket it stored, and the clock at the end."""
    clock = [reads[0].at]
    charger = Charger(client, prefix, case.slot_s, clock=lambda: clock[0])
    tick = reads[0].at
    for at, group in itertools.groupby(reads, key=lambda r: r.at):
        while tick < at:
            clock[0] = tick
            await charger.accrue(tick)
            tick += case.accrue_s
        clock[0] = at
        await charger.apply_many([over_the_wire(r.record) for r in group])
    # The window's next rounds: nothing is running, so they change nothing.
    for _ in range(3):
        clock[0] = max(clock[0], tick)
        await charger.accrue(clock[0])
        tick += case.accrue_s
    store = charger.store
    buckets: Buckets = {}
    for allocation in await store.allocations():
        raw = await client.hgetall(store.usage_key(allocation))
        buckets[allocation] = {int(h): float(v) for h, v in raw.items()}
    return buckets, clock[0]


def nonzero(buckets: Buckets, first_hour: int = -(2**62)) -> Buckets:
    """The buckets' non-zero hours from ``first_hour`` on (a settle can leave an hour at 0)."""
    out = {a: {h: v for h, v in hs.items() if v and h >= first_hour} for a, hs in buckets.items()}
    return {a: hs for a, hs in out.items() if hs}


def allocated_gpu_seconds(record: SimRecord) -> dict[str, float]:
    totals: dict[str, float] = {}
    for seg in record.segments:
        if seg.allocated and seg.allocation is not None and seg.end > seg.start:
            totals[seg.allocation] = totals.get(seg.allocation, 0.0) + seg.gpus * (
                seg.end - seg.start
            )
    return totals


# -- the test ------------------------------------------------------------------------------------


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[tuple[redis_asyncio.Redis, str]]:
    client = redis_asyncio.Redis.from_url(redis_url)
    await client.ping()
    prefix = f"parity-{uuid.uuid4().hex}"
    yield client, prefix
    keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def check_parity(
    client: redis_asyncio.Redis, prefix: str, case: Case, record: SimRecord
) -> tuple[Buckets, Buckets]:
    """Run accounting on ``record``'s log and compare; the two stores, for more checks."""
    accounted, now = await run_accounting(client, prefix, case, log_of(record, case))
    simulated = record.usage
    # The store keeps the hours from its oldest charged slot's on; the simulator keeps all.
    kept_from = math.floor(oldest_charged(now, case.slot_s) / HOUR_S) + 1
    assert nonzero(accounted, kept_from) == nonzero(simulated, kept_from)
    if all(h >= kept_from for hs in simulated.values() for h in hs):
        assert nonzero(accounted) == nonzero(simulated)
        totals = {a: math.fsum(hs.values()) for a, hs in nonzero(accounted).items()}
        assert totals == allocated_gpu_seconds(record)
    return accounted, simulated


@pytest.mark.parametrize("name", list(CASES))
async def test_the_simulator_and_accounting_charge_the_same_gpu_seconds_per_allocation_and_hour(
    redis_client: tuple[redis_asyncio.Redis, str], name: str
) -> None:
    case = CASES[name]
    record = run_simulator(case)
    assert record.usage, "the simulator charged nothing: the case proves nothing"
    accounted, simulated = await check_parity(*redis_client, case, record)
    if name.startswith("unallocated"):
        assert {a for a, hs in nonzero(simulated).items()} == {"alpha"}
        assert record.preemptions and any(not s.allocated for s in record.segments)
    if name.startswith("a-reclaim"):
        preempted = [p for p in record.preemptions if p.allocation == "beta"]
        assert preempted and all(p.requeued for p in preempted)
    if name == "a-run-longer-than-the-store-keeps":
        # The simulator keeps the run's first day; the store dropped what it does not keep.
        assert min(simulated["alpha"]) < min(accounted["alpha"])


async def test_an_ai2_like_day_is_charged_the_same_by_both(
    redis_client: tuple[redis_asyncio.Redis, str],
) -> None:
    """A generated day (gangs, host failures and drains, requeues, unallocated filler): the
    case the table does not write by hand. Its times are whole seconds."""
    scenario = generate_ai2(7, Ai2Knobs(days=1, hosts=4))
    case = Case(
        jobs=scenario.jobs,
        cluster=load_cluster(scenario.cluster),
        tree=parse_tree(scenario.budgets),
        accrue_s=600.0,
        end_delay_s=75.0,
    )
    record = run_simulator(case)
    assert record.preemptions and len(record.segments) > 50
    await check_parity(*redis_client, case, record)
