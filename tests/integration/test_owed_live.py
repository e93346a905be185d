"""``allot owed`` end to end on real NATS: the dashboard service follows a crafted log (part
replayed, part followed live) and answers ``allot.v1.query.owed``; the answer equals the
pure ``owed_snapshot`` on the same records read back from the streams, and matches numbers
worked by hand; the CLI prints it for the last day and week; a window longer than the
history is refused naming the option."""

from __future__ import annotations

import asyncio
import json
import time

import msgspec
import pytest
from live_harness import eventually, records, seed, submitted

from allot import bus
from allot.cli import main as cli_main
from allot.eventlog.owed_query import owed_snapshot
from allot.eventlog.timeline import LogTimeline
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import Client
from allot.sdk.errors import CommandRejectedError
from allot.services.dashboard.service import DashboardService

pytestmark = pytest.mark.integration

DAY = 86400.0

# Hand-worked (one 8-GPU host, nlp and vision half each, so 4 GPUs each: demand never
# reaches the share, and owed is the demand whatever the bucket edges):
#   nlp    waited 2 GPUs x 60 s, ran 2 x 600 s: owed 1320 GPU-s, delivered 1200
#   vision waited 1 GPU x 300 s, ran 1 x 600 s: owed 900, delivered 600
#   free   (unallocated) ran 4 GPUs: never owed
EXPECTED = {
    "nlp": (round(1320 / 3600, 6), round(1200 / 3600, 6), round(1200 / 1320, 6), 0.5),
    "vision": (round(900 / 3600, 6), round(600 / 3600, 6), round(600 / 900, 6), 0.5),
}
OVERALL = round(1800 / 2220, 6)


def _rows(
    snapshot_rows: list[dict[str, object]] | tuple[m.OwedRow, ...],
) -> dict[str, tuple[object, ...]]:
    out: dict[str, tuple[object, ...]] = {}
    for row in snapshot_rows:
        r = row if isinstance(row, dict) else msgspec.to_builtins(row)
        out[str(r["allocation"])] = (
            r["owed_gpu_h"],
            r["delivered_gpu_h"],
            r["ratio"],
            r["effective_share"],
        )
    return out


@pytest.mark.usefixtures("past_history")
async def test_allot_owed_from_the_live_log(
    paged_log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    nc, js = await bus.connect(paged_log, "test-owed")
    await seed(js, {})
    t = time.time() - 3000  # everything happened in the last hour
    await bus.publish(js, s.host_state("h1"), m.HostRegistered(host="h1", gpus=8, at=t - 100))
    await bus.publish(js, s.LEADER, m.LeaderElected(epoch=1, leader="test", at=t))

    async def event(alloc: str | None, record: msgspec.Struct) -> None:
        await bus.publish(js, bus.event_subject(alloc, record), record)

    def placed(wid: str, alloc: str | None, gpus: tuple[int, ...], at: float) -> m.WorkloadPlaced:
        return m.WorkloadPlaced(
            workload_id=wid,
            allocation=alloc,
            at=at,
            gpus=len(gpus),
            assignment=(m.HostGpus(host="h1", gpus=gpus),),
            epoch=1,
        )

    # Replayed by the dashboard when it starts:
    await event("nlp", submitted("a", "nlp", 2, t))
    await event("nlp", placed("a", "nlp", (0, 1), t + 60))
    await event("nlp", m.WorkloadCompleted(workload_id="a", allocation="nlp", at=t + 660))
    await event("vision", submitted("b", "vision", 1, t + 100))
    await event("vision", placed("b", "vision", (2,), t + 400))
    await event(None, submitted("free", None, 4, t + 100))
    await event(None, placed("free", None, (4, 5, 6, 7), t + 100))
    await event(None, m.WorkloadCompleted(workload_id="free", at=t + 2000))

    service = DashboardService(paged_log, http_port=0, tracing=False)
    await service.on_started()
    try:
        async with Client(paged_log) as c:
            # Followed live, after the replay:
            await event(
                "vision", m.WorkloadCompleted(workload_id="b", allocation="vision", at=t + 1000)
            )
            reply = await eventually(
                lambda: c.owed(DAY, 3600),
                lambda r: _rows(r.rows).get("vision", (None,))[1] == EXPECTED["vision"][1],
            )
            assert _rows(reply.rows) == EXPECTED
            assert reply.overall == OVERALL
            assert (reply.window_s, reply.bucket_s) == (DAY, 3600)
            assert reply.since == pytest.approx(reply.at - DAY)

            # The same numbers from the pure function on the records read back from NATS.
            log = [
                *[r for r in await records(js, "USAGE") if isinstance(r, m.BudgetTreeSet)],
                *await records(js, "HOSTS"),
                *await records(js, "WORKLOADS"),
            ]
            replayed = LogTimeline()
            for record in log:
                replayed.apply(record)
            assert owed_snapshot(replayed, m.OwedQuery(window_s=DAY), reply.at) == reply

            with pytest.raises(CommandRejectedError) as refused:
                await c.owed(30 * DAY)
            assert refused.value.field == "window_s"
            assert "longer than the history kept" in refused.value.reason

        # The CLI, default windows (the last day and the last week), JSON lines. The
        # in-process service logs to stdout too: keep only what the command printed.
        capsys.readouterr()
        code = await asyncio.to_thread(cli_main.main, ["owed", "--json", "--nats-url", paged_log])
        out = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        assert code == 0
        envelopes = [json.loads(line) for line in out]
        assert [e["data"]["window_s"] for e in envelopes] == [DAY, 7 * DAY]
        for e in envelopes:
            assert e["kind"] == "OwedSnapshot"
            assert _rows(e["data"]["rows"]) == EXPECTED
            assert e["data"]["overall"] == OVERALL

        capsys.readouterr()
        code = await asyncio.to_thread(
            cli_main.main, ["owed", "--window", "1d", "--nats-url", paged_log]
        )
        printed = capsys.readouterr().out.splitlines()
        assert code == 0
        text = printed[next(i for i, line in enumerate(printed) if line.startswith("last 1d: ")) :]
        assert text[3].split() == ["nlp", "50.0", "0.37", "0.33", "90.9%", "0.00", "0.00"]
        assert text[5].split() == ["overall", "100.0", "0.62", "0.50", "81.1%", "0.00", "0.00"]

        code = await asyncio.to_thread(
            cli_main.main, ["owed", "--window", "30d", "--nats-url", paged_log]
        )
        assert code == 2
        assert "allot owed: --window: " in capsys.readouterr().err
    finally:
        await service.on_stopping()
        await nc.close()
