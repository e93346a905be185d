"""Squatting, end to end on a secure stack (``allot up --secure`` as processes: real
nats-server with generated users, TLS, the services, a fake agent as its own NATS user).

A fake workload that asks for an idle profile (``ALLOT_FAKE_UTIL=idle``) is flagged by the
health service within the threshold plus one report interval; the owner's team, logged in
with only its own grants, hears the flag on ``allot.v1.usage.idle.nlp.*`` and another team
may not subscribe there; a busy run of the same team is never flagged; ``allot idle`` lists
it; the idle GPU-hours appear in ``allot owed --json`` and in ``/metrics``; its cancel
clears the flag (``ended``). An agent can report only its own hosts, and the health service
refuses a report whose time the clock contradicts, naming the field.

With the health service's ``--idle-preempt`` (``allot up --idle-preempt``; decision 0055)
the flag asks for preemption: the placement leader gives the idle run a notice, reason
``idle``, once its minimum runtime has passed (not before, though flagged earlier), and
does not requeue it; a busy run beside it is left alone. Without the switch the same run
is flagged and keeps running past its protection.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.request
from pathlib import Path

import msgspec
import pytest
from live_harness import eventually, of_type, quick_stack

from allot.cli import main as cli_main
from allot.ops.stack import AgentSpec, Stack
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import Client
from allot.sdk.errors import PermissionDeniedError, SdkError
from allot.services.health import IDLE_READ_EVERY_S

pytestmark = pytest.mark.integration

THRESHOLD_S = 3.0
EVERY_S = 0.5
SLACK_S = 1.0
"""Scheduling jitter of the agent's report loop and of the delivery."""


def _metrics(url: str, user: str, password: str) -> str:
    request = urllib.request.Request(url + "/metrics")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def _sample(text: str, name: str, allocation: str) -> float | None:
    prefix = f'{name}{{allocation="{allocation}"}} '
    line = next((x for x in text.splitlines() if x.startswith(prefix)), None)
    return None if line is None else float(line.split()[-1])


async def test_an_idle_fake_workload_is_flagged_its_owner_told_and_its_idle_hours_counted(
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = quick_stack(
        tmp_path,
        redis_url,
        "idle",
        secure=True,
        agents=(AgentSpec("fk", hosts=2, gpus=4),),
        placements=1,
        idle_after_s=THRESHOLD_S,
        util_every_s=EVERY_S,
    )
    with Stack(config) as stack:
        assert stack.auth is not None and stack.ca_file is not None
        assert stack.dashboard_url is not None
        monkeypatch.setenv("ALLOT_NATS_CA", str(stack.ca_file))
        password = {u: c.dashboard_password for u, c in stack.auth.users.items()}
        heard: list[msgspec.Struct] = []
        heard_at: dict[str, float] = {}

        def keep(record: msgspec.Struct) -> None:
            heard.append(record)
            heard_at.setdefault(type(record).__name__, time.time())

        async with (
            Client(stack.url_for("nlp"), timeout=5.0) as nlp,
            Client(stack.url_for("vision"), timeout=5.0, retries=0) as vision,
        ):
            await nlp.on_idle(keep, allocation="nlp")
            # Another team may neither hear nor ask about nlp's idle work.
            with pytest.raises(PermissionDeniedError):
                await vision.on_idle(keep, allocation="nlp")
            with pytest.raises(SdkError):
                await vision.idle(scope="nlp", timeout=2.0)

            squat = await nlp.submit(
                client_id="squat",
                allocation="nlp",
                gpus=2,
                min_runtime_s=600,
                duration_s=600,
                env={"ALLOT_FAKE_UTIL": "idle"},
            )
            busy = await nlp.submit(
                client_id="train", allocation="nlp", gpus=2, min_runtime_s=600, duration_s=600
            )
            placed = await eventually(
                lambda: nlp.status(squat.workload_id, scope="nlp"),
                lambda st: st.state == "running",
                timeout=30,
            )
            assert placed.started_at is not None

            flags = await eventually(
                lambda: asyncio.sleep(
                    0.1, [r for r in heard if isinstance(r, m.WorkloadFlaggedIdle)]
                ),
                bool,
                timeout=THRESHOLD_S + 20,
            )
            (flag,) = flags
            assert flag.workload_id == squat.workload_id
            assert (flag.allocation, flag.user, flag.gpus) == ("nlp", "nlp", 2)
            assert flag.at - flag.idle_since >= THRESHOLD_S
            # Flagged within the threshold plus one report interval of its placement, once
            # the watch has read the placement (it reads the log every IDLE_READ_EVERY_S
            # and judges no report of a run it does not know yet).
            due = placed.started_at + IDLE_READ_EVERY_S + THRESHOLD_S + EVERY_S
            assert flag.at <= due + SLACK_S
            assert heard_at["WorkloadFlaggedIdle"] <= due + 2 * SLACK_S
            assert flag.preempt is False and flag.reason.startswith("every GPU below 5%")

            # allot idle: the team's own flagged run; the busy one is not flagged.
            snapshot = await nlp.idle(scope="nlp")
            assert [r.workload_id for r in snapshot.rows] == [squat.workload_id]
            await asyncio.sleep(THRESHOLD_S)
            assert {getattr(r, "workload_id", "") for r in heard} == {squat.workload_id}
            busy_status = await nlp.status(busy.workload_id, scope="nlp")
            assert busy_status.state == "running"

            # allot owed --json (as the team): idle GPU-hours of nlp, none of vision.
            url = stack.url_for("nlp")
            code = await asyncio.to_thread(
                cli_main.main, ["owed", "--window", "1h", "--json", "--nats-url", url]
            )
            assert code == 0
            owed = json.loads(capsys.readouterr().out.splitlines()[0])
            rows = {r["allocation"]: r for r in owed["data"]["rows"]}
            idle_h = rows["nlp"]["idle_gpu_h"]
            lower = 2 * (owed["at"] - flag.idle_since - 1.0) / 3600.0
            assert lower <= idle_h <= 2 * (owed["at"] - flag.idle_since + 1.0) / 3600.0
            assert rows.get("vision", {}).get("idle_gpu_h", 0.0) == 0.0

            # /metrics (the team's login): the counter and the GPUs flagged now.
            text = await asyncio.to_thread(_metrics, stack.dashboard_url, "nlp", password["nlp"])
            assert (_sample(text, "allot_idle_gpu_seconds_total", "nlp") or 0.0) > 2 * THRESHOLD_S
            assert _sample(text, "allot_idle_gpus", "nlp") == 2.0
            assert _sample(text, "allot_idle_workloads", "vision") is None

            # Its end clears the flag; the owner hears that too.
            await nlp.cancel(squat.workload_id, allocation="nlp")
            cleared = await eventually(
                lambda: asyncio.sleep(
                    0.1, [r for r in heard if isinstance(r, m.WorkloadIdleCleared)]
                ),
                bool,
                timeout=30,
            )
            assert (cleared[0].why, cleared[0].idle_since) == ("ended", flag.idle_since)
            assert cleared[0].idle_gpu_seconds >= 2 * THRESHOLD_S
            assert (await nlp.idle(scope="nlp")).rows == ()

        # No report of the agent was refused: a host's first ones, sent before health had
        # registered it (from a heartbeat), are not errors (nothing ran there yet).
        agent_log = (config.run_dir / "logs" / "agent-fk.log").read_text()
        assert "utilization refused" not in agent_log
        await _agents_speak_only_for_their_hosts(stack)


PROTECTED_S = 8
"""The runs' minimum runtime: their flag (about ``THRESHOLD_S + EVERY_S`` after placement)
comes while they are protected."""


@pytest.mark.parametrize("switch", [True, False], ids=["idle-preempt-on", "idle-preempt-off"])
async def test_idle_preempt_preempts_a_flagged_run_once_its_protection_ends(
    redis_url: str, tmp_path: Path, switch: bool
) -> None:
    config = quick_stack(
        tmp_path,
        redis_url,
        "idlep",
        agents=(AgentSpec("fk", hosts=1, gpus=4),),
        placements=1,
        idle_after_s=THRESHOLD_S,
        util_every_s=EVERY_S,
        idle_preempt=switch,
        dashboard=False,
    )
    with Stack(config) as stack:
        async with Client(stack.url_for(), timeout=5.0) as c:
            notices: list[m.PreemptionNotice] = []
            idle: list[msgspec.Struct] = []
            await c.on_preemption(notices.append, allocation="nlp")
            await c.on_idle(idle.append, allocation="nlp")

            async def submit(client_id: str, env: dict[str, str]) -> m.WorkloadAccepted:
                return await c.submit(
                    client_id=client_id,
                    allocation="nlp",
                    user="ann",
                    gpus=2,
                    min_runtime_s=PROTECTED_S,
                    duration_s=600,
                    env=env,
                )

            squat = await submit("squat", {"ALLOT_FAKE_UTIL": "idle"})
            busy = await submit("train", {})
            placed = await eventually(
                lambda: c.status(squat.workload_id, scope="nlp"),
                lambda st: st.state == "running",
                timeout=30,
            )
            assert placed.started_at is not None and placed.protected_until is not None
            flags = await eventually(
                lambda: asyncio.sleep(0.1, of_type(idle, m.WorkloadFlaggedIdle)),
                bool,
                timeout=THRESHOLD_S + 20,
            )
            (flag,) = flags
            assert (flag.workload_id, flag.preempt) == (squat.workload_id, switch)
            assert flag.at < placed.protected_until  # flagged while protected

            if switch:
                (notice,) = await eventually(
                    lambda: asyncio.sleep(0.1, list(notices)), bool, timeout=PROTECTED_S + 20
                )
                assert (notice.workload_id, notice.reason) == (squat.workload_id, "idle")
                assert (notice.requeue, notice.preemptor, notice.attempt) == (False, None, 1)
                assert notice.at >= placed.protected_until  # its protection held
                ended = await eventually(
                    lambda: c.status(squat.workload_id, scope="nlp"),
                    lambda st: st.state not in ("running", "noticed"),
                    timeout=30,
                )
                # Preempted for good: resumable, yet not requeued.
                assert (ended.state, ended.reason, ended.attempt) == ("preempted", "idle", 1)
                assert ended.requeued_at is None
                cleared = await eventually(
                    lambda: asyncio.sleep(0.1, of_type(idle, m.WorkloadIdleCleared)),
                    bool,
                    timeout=20,
                )
                assert cleared[0].why == "ended"
            else:
                # Past its protection, and then some: flagged, never noticed.
                await asyncio.sleep(max(0.0, placed.protected_until - time.time()) + 3.0)
                assert notices == []
                still = await c.status(squat.workload_id, scope="nlp")
                assert (still.state, still.attempt) == ("running", 1)
            assert (await c.status(busy.workload_id, scope="nlp")).state == "running"
            assert all(n.workload_id != busy.workload_id for n in notices)


async def _agents_speak_only_for_their_hosts(stack: Stack) -> None:
    """The agent's own NATS user: its host's util subject answers; a payload naming another
    host and a time ahead of the clock are refused naming the field; another host's
    subject is refused by the server."""
    async with Client(stack.url_for("agent-fk"), timeout=5.0, retries=0) as agent:
        now = time.time()

        async def ask(
            subject: str, report: m.HostUtilization
        ) -> m.CommandAccepted | m.CommandRejected:
            reply = await agent.nc.request(subject, codec.encode(report), timeout=5.0)
            return msgspec.json.decode(reply.data, type=m.CommandAccepted | m.CommandRejected)

        own = s.host_util("fk-0000")
        ok = await ask(
            own, m.HostUtilization(host="fk-0000", since=now - 1, sent_at=now, util=(0.0,) * 4)
        )
        assert isinstance(ok, m.CommandAccepted), ok
        other = await ask(
            own, m.HostUtilization(host="fk-0001", since=now - 1, sent_at=now, util=(0.0,))
        )
        assert isinstance(other, m.CommandRejected) and other.field == "host"
        ahead = await ask(
            own, m.HostUtilization(host="fk-0000", since=now, sent_at=now + 3600, util=(0.0,))
        )
        assert isinstance(ahead, m.CommandRejected) and ahead.field == "sent_at"
        assert "ahead of the clock" in ahead.reason
        with pytest.raises(Exception):  # noqa: B017  (refused by nats-server: no answer)
            await agent.nc.request(
                s.host_util("someone-else"),
                codec.encode(
                    m.HostUtilization(host="someone-else", since=now - 1, sent_at=now, util=(0.0,))
                ),
                timeout=2.0,
            )
