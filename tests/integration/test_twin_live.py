"""Twin parity on a live history: the whole stack as processes (two placement instances, a
leader and a standby) runs a contended mix, unallocated filler that allocated work of two
allocations preempts, then ``allot twin`` reads the log back through NATS and replays every
live cycle through the core's ``run_cycle``: at least 99% of the placements are identical
(workload, hosts, GPUs), every difference has a kind that explains it, the notices too; the
same history saved to a file replays to the same figures with no server."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import msgspec
import pytest
from live_harness import eventually, quick_stack
from test_whatif_live import BUDGETS, allot

from allot.eventlog.twin import KINDS, UNEXPLAINED
from allot.ops.log_reader import WHOLE_LOG, read_log
from allot.ops.stack import AgentSpec, Stack
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import Client

pytestmark = pytest.mark.integration

TWIN_READS: dict[str, str | tuple[str, ...]] = {"USAGE": (s.BUDGET_TREE, s.RANKING, s.ALL_IDLE)}
"""What ``allot twin`` reads of USAGE."""


def _of(stream: str, records: list[msgspec.Struct]) -> list[msgspec.Struct]:
    usage = m.BudgetTreeSet | m.RankingUpdated | m.IdleEvent

    def stream_of(r: msgspec.Struct) -> str:
        if isinstance(r, m.HostEvent):
            return "HOSTS"
        return "USAGE" if isinstance(r, usage) else "WORKLOADS"

    return [r for r in records if stream_of(r) == stream]


def _shown(record: msgspec.Struct) -> msgspec.Struct:
    """As the history pages show it: a submission without its command and env."""
    if isinstance(record, m.WorkloadSubmitted):
        return msgspec.structs.replace(record, command=(), env={})
    return record


# The stack's knobs, given to the replay too (the log does not record them).
KNOBS = ["--grace-s", "2", "--unallocated-grace-s", "1", "--unallocated-settle-s", "1"]


async def test_a_contended_live_history_is_replayed_placement_for_placement(
    fresh_log: str, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(BUDGETS)
    config = quick_stack(
        tmp_path / "run",
        redis_url,
        "twin",
        nats_url=fresh_log,
        budgets=budgets,
        agents=(AgentSpec("gpu", hosts=2, gpus=8),),
        unallocated_grace_s=1,
        unallocated_settle_s=1.0,
        lease_ttl_s=1.0,
        accrue_s=1.0,
        slot_s=1.0,
        dashboard=False,
    )
    url = ["--nats-url", fresh_log]
    with Stack(config):
        began = time.time()
        async with Client(fresh_log) as c:
            ids = []
            for i in range(2):  # unallocated filler: every GPU, preempted by what follows
                reply = await c.submit(client_id=f"free-{i}", user="batch", gpus=8, duration_s=8.0)
                ids.append(reply.workload_id)
            await asyncio.sleep(1.0)
            # Twice the cluster from each allocation: queues, notices, requeues, ends.
            for i in range(8):
                for alloc in ("nlp", "vision"):
                    reply = await c.submit(
                        client_id=f"{alloc}-{i}",
                        user=alloc,
                        allocation=alloc,
                        gpus=4,
                        min_runtime_s=1,
                        duration_s=3.0,
                    )
                    ids.append(reply.workload_id)

            async def completed() -> int:
                return sum([(await c.status(w)).state == "completed" for w in ids])

            await eventually(completed, lambda n: n >= 12, timeout=90)
        since = f"{math.ceil(time.time() - began) + 2}s"
        saved = tmp_path / "twin.jsonl"
        code, out, err = await allot(
            capsys, "twin", "--since", since, "--json", "--save", str(saved), *KNOBS, *url
        )
        # What twin reads through ranking's history pages (one filter of USAGE a page,
        # merged back) is what the log itself holds, stream by stream (the log grows
        # between the two reads: the first is a prefix of the second).
        paged: list[msgspec.Struct] = []
        direct: list[msgspec.Struct] = []
        await read_log(fresh_log, paged.append, subjects=TWIN_READS, via="query")
        await read_log(fresh_log, direct.append, subjects=TWIN_READS, via="jetstream")
        for stream in WHOLE_LOG:
            ours, theirs = _of(stream, paged), [_shown(r) for r in _of(stream, direct)]
            assert ours and ours == theirs[: len(ours)], stream
        assert any(isinstance(r, m.RankingUpdated) for r in paged)
    assert code == 0, err
    data = json.loads(out)["data"]
    placements, notices = data["placements"], data["notices"]
    assert placements["live"] >= 12 and notices["live"] >= 2, data["cycles"]
    assert data["fraction_identical"] >= 0.99, data["differences"]
    assert notices["fraction_identical"] >= 0.99, data["differences"]
    assert set(data["kinds"]) <= set(KINDS) - {UNEXPLAINED}, data["kinds"]
    assert all(d["kind"] in KINDS for d in data["differences"])

    # The saved history replays, with no server, to the same figures.
    code, out, err = await allot(capsys, "twin", "--from", str(saved), "--json", *KNOBS)
    assert code == 0, err
    offline = json.loads(out)["data"]
    assert offline["placements"] == placements and offline["kinds"] == data["kinds"]
