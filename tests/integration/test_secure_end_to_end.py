"""The whole contract on a secure stack (``allot up --secure``: logins, TLS), each service on
its own login (decision 0084): a real run preempted for an allocation owed GPUs, requeued
and completed, charged exactly; a watch, a drain and undrain, a budget change, history and
owed pages, the operators' rebuild of the usage store, a placement leader killed. The
server refuses nothing any service asked."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from asyncio.subprocess import PIPE, STDOUT
from pathlib import Path

import pytest
from live_harness import assert_preempted_and_requeued, charged_as_ran, eventually
from test_end_to_end import WORKER

from allot import bus
from allot.ops.stack import AgentSpec, Stack, StackConfig
from allot.proto import messages as m
from allot.sdk import Client
from allot.sdk.errors import NoResponderError

pytestmark = pytest.mark.integration


async def test_each_service_on_its_own_login_runs_the_whole_contract(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = StackConfig(
        run_dir=tmp_path,
        redis_url=redis_url,
        redis_prefix=f"sec{uuid.uuid4().hex[:8]}",
        secure=True,
        agents=(AgentSpec("gpu01", gpus=8, fake=False),),
        placements=2,
        grace_s=3,
        unallocated_settle_s=0.5,
        lease_ttl_s=1.0,
        rank_every_s=1.0,
        accrue_s=1.0,
        slot_s=1.0,
        heartbeat_timeout_s=10.0,
    )
    marker = tmp_path / "victim"
    with Stack(config) as stack:
        assert stack.auth is not None and stack.ca_file is not None
        monkeypatch.setenv("ALLOT_NATS_CA", str(stack.ca_file))
        async with (
            Client(stack.url_for("nlp")) as nlp,
            Client(stack.url_for("ads")) as ads,
            Client(stack.url_for("ops")) as ops,
            Client(stack.url_for("admin")) as admin,
        ):
            notices: list[m.PreemptionNotice] = []
            sub = await nlp.on_preemption(notices.append, allocation="nlp")
            victim = await nlp.submit(
                client_id="victim",
                allocation="nlp",
                gpus=8,
                min_runtime_s=3,
                command=[sys.executable, "-c", WORKER, str(marker)],
            )
            wid = victim.workload_id
            await eventually(
                lambda: _status(nlp, wid, "nlp"), lambda s: s is not None and s.state == "running"
            )
            seen = [r async for r in _until_running(nlp, wid)]
            assert any(isinstance(r, m.WorkloadPlaced) for r in seen)
            late = await ads.submit(
                client_id="ads-1",
                allocation="ads",
                gpus=2,
                min_runtime_s=60,
                command=[sys.executable, "-c", "import time; time.sleep(2)"],
            )
            notice = (await eventually(lambda: asyncio.sleep(0, notices), bool, timeout=30))[0]
            assert (notice.workload_id, notice.preemptor) == (wid, late.workload_id)
            final = await eventually(
                lambda: _status(nlp, wid, "nlp"),
                lambda s: s is not None and s.state == "completed",
                timeout=60,
            )
            assert final.attempt == 2
            await eventually(
                lambda: _status(ads, late.workload_id, "ads"),
                lambda s: s is not None and s.state == "completed",
                timeout=60,
            )
            await sub.unsubscribe()
            # An operator drains and undrains; a manager changes a budget; history and owed
            # pages answer (ranking's and the dashboard's logins).
            assert (await ops.drain("gpu01", reason="test")).at > 0
            assert (await ops.undrain("gpu01")).at > 0
            assert (await admin.set_budget(("root", "product", "ads"), 60)).at > 0
            page = await ops.history_page("WORKLOADS", limit=1000)
            assert page.end
            log = [bus.decode_record(r.subject, bytes(r.record)) for r in page.records]
            owed = await nlp.owed(3600.0, 60)
            assert {row.allocation for row in owed.rows} >= {"nlp", "ads"}
            # An operator replays the live cycles (allot twin): the budget trees, rankings
            # and idle flags of USAGE come through ranking's history pages too (the
            # operators' login may not read the log itself).
            out = await _cli("twin", "--since", "10m", "--json", "--nats-url", stack.url_for("ops"))
            twin = json.loads(out)["data"]
            assert twin["placements"]["live"] >= 3, twin
        # Charged == run, by accounting's own login.
        await charged_as_ran(log, redis_url, config.redis_prefix)
        # The operators' rebuild, as the shared login over TLS (it once hung there, without
        # the CA): the same charges, recomputed from the log.
        stack.kill("accounting", signal.SIGSTOP)
        try:
            argv = ["accounting", "rebuild", "--nats-url", stack.url_for()]
            argv += ["--redis-url", redis_url, "--prefix", config.redis_prefix, "--slot-s", "1"]
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "allot.cli.main", *argv, stdout=PIPE, stderr=STDOUT
            )
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), 60)
            finally:
                if proc.returncode is None:  # hung: killed, and the test fails below
                    proc.kill()
                    await proc.wait()
            assert proc.returncode == 0 and b"replayed" in out, out
            await charged_as_ran(log, redis_url, config.redis_prefix)
        finally:
            stack.kill("accounting", signal.SIGCONT)
        assert_preempted_and_requeued(log, wid)
        # The leader killed: the standby (the same login) takes the lease and places work.
        stack.kill("placement-1", signal.SIGKILL)
        async with Client(stack.url_for("nlp")) as nlp:
            after = await nlp.submit(client_id="after", allocation="nlp", gpus=1, duration_s=1)
            await eventually(
                lambda: _status(nlp, after.workload_id, "nlp"),
                lambda s: s is not None and s.state == "completed",
                timeout=60,
            )
    server_log = (tmp_path / "logs" / "nats-server.log").read_text(errors="replace")
    refused = [line for line in server_log.splitlines() if "Violation" in line]
    assert not [line for line in refused if "user:allot-" in line], refused


async def _cli(*argv: str) -> bytes:
    """``allot`` in a subprocess (its own event loop), within a minute; its stdout."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "allot.cli.main", *argv, stdout=PIPE, stderr=PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err
    return out


async def _until_running(c: Client, wid: str):  # type: ignore[no-untyped-def]
    """The victim's records through its team's watch, up to its start."""
    async for record in c.watch(wid, "nlp", idle_timeout=30):
        yield record
        if isinstance(record, m.WorkloadStarted):
            return


async def _status(c: Client, wid: str, scope: str) -> m.WorkloadStatus | None:
    try:
        return await c.status(wid, scope=scope)
    except NoResponderError:  # between leaders (a lease of 1 s): nobody answers queries
        return None
