"""The dashboard service over HTTP, on real NATS, without a browser (tests/browser drives
Chromium against the whole stack):

1. from a crafted log alone (no placement leader): a preemption with its reason and
   preemptor on the workload page, owed vs delivered, /metrics in the Prometheus format,
   /healthz; a missing leader is a banner, not a failed page; bad input (a workload id, a
   chart window, an owed query) is refused naming the field; no page holds a URL;
2. with a placement leader following the same log: the queue page's order is the leader's
   ``QueueSnapshot`` order, held GPUs match, and a draining host shows its deadline (the
   protection end of the work on it).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import get_args

import aiohttp
import msgspec
import pytest
from live_harness import eventually, seed, submitted
from nats.js import JetStreamContext

from allot import bus
from allot.auth.dashboard import Viewer
from allot.bus import service_main
from allot.eventlog.timeline import LogTimeline
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import Client
from allot.sdk.errors import NoResponderError
from allot.services.dashboard.api import DashboardViews
from allot.services.dashboard.service import DashboardService
from allot.services.dashboard.workload import PREEMPT_TEXT
from allot.services.placement.service import PlacementService

pytestmark = pytest.mark.integration

PAGES = ("/", "/?window=1h", "/queue", "/hosts", "/owed")
_REJECTED = msgspec.json.Decoder(m.CommandRejected | m.OwedSnapshot)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, str, dict[str, str]]:
    async with http.get(url) as r:
        return r.status, await r.text(), dict(r.headers)


def _attrs(html: str, selector_attr: str) -> list[str]:
    """Values of ``selector_attr="..."`` in document order, in the body (the stylesheet
    names some attributes too)."""
    return re.findall(rf'{selector_attr}="([^"]*)"', html[html.find("<body") :])


@pytest.mark.usefixtures("past_history")
async def test_pages_from_the_log_alone(paged_log: str, http: aiohttp.ClientSession) -> None:
    nc, js = await bus.connect(paged_log, "test-dashboard")
    await seed(js, {})
    t = time.time() - 7200
    await bus.publish(js, s.host_state("h1"), m.HostRegistered(host="h1", gpus=8, at=t - 100))

    async def event(alloc: str, record: msgspec.Struct) -> None:
        wid = record.workload_id  # type: ignore[attr-defined]
        subject = s.preempt(alloc, wid) if isinstance(record, m.PreemptionNotice) else None
        await bus.publish(js, subject or bus.event_subject(alloc, record), record)

    await bus.publish(js, s.LEADER, m.LeaderElected(epoch=1, leader="test", at=t - 1))
    for wid, alloc, gpus in (("vic", "vision", (0, 1, 2, 3)), ("req", "nlp", (4, 5, 6, 7))):
        at = t if wid == "vic" else t + 590
        await event(
            alloc,
            m.WorkloadSubmitted(
                workload_id=wid,
                client_id=wid,
                user="ann",
                gpus=4,
                allocation=alloc,
                min_runtime_s=60,
                at=at,
            ),
        )
        await event(
            alloc,
            m.WorkloadPlaced(
                workload_id=wid,
                allocation=alloc,
                at=at + 10,
                gpus=4,
                assignment=(m.HostGpus(host="h1", gpus=gpus),),
                min_runtime_s=60,
                epoch=1,
            ),
        )
    await event(
        "vision",
        m.PreemptionNotice(
            workload_id="vic",
            allocation="vision",
            at=t + 600,
            reason="better-ranked",
            grace_deadline=t + 610,
            requeue=True,
            gpus=4,
            preemptor="req",
            victim_held_gpus=4,
            victim_entitlement_gpus=4.0,
            epoch=1,
            victim_window_gpu_s=7200.0,
            victim_rank=1,
            victim_fairshare=0.5,
            preemptor_allocation="nlp",
            preemptor_window_gpu_s=1800.0,
            preemptor_rank=2,
            preemptor_fairshare=1.0,
        ),
    )
    await event(
        "vision",
        m.WorkloadPreempted(
            workload_id="vic", allocation="vision", at=t + 605, reason="better-ranked"
        ),
    )
    await event("nlp", m.WorkloadCompleted(workload_id="req", allocation="nlp", at=t + 4190))

    service = DashboardService(paged_log, http_port=0, query_timeout_s=0.3, tracing=False)
    await service_main.start(service)
    try:
        base = service.url
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", base), base
        status, body, _ = await _get(http, base + "/healthz")
        assert status == 200 and json.loads(body)["caught_up"] is True

        # The workload page: the preemption, its reason, its preemptor, then the requeue.
        status, page, headers = await _get(http, base + "/workload/vic")
        assert status == 200
        kinds = _attrs(page, "data-event-kind")
        assert kinds == [
            "submitted",
            "placed",
            "protected-until",
            "notice",
            "preempted",
            "requeued",
        ], kinds
        notice = re.search(r'<li data-event-kind="notice"[^>]*>', page)
        assert notice is not None
        assert 'data-reason="better-ranked"' in notice.group()
        assert 'data-preemptor="req"' in notice.group()
        assert "taken by a better-ranked allocation" in page
        assert "its allocation used 2.00 GPU-h in the window, fairshare factor 0.500 (1 = " in page
        assert "allocation nlp used 0.50 GPU-h in the window, fairshare factor 1.000" in page
        assert "left (preempted)" in page and "5s before its deadline" in page
        assert 'href="/workload/req"' in page
        # Its JSON twin: an assignment is a list of JSON objects, not Python reprs.
        status, body, _ = await _get(http, base + "/api/workload/vic")
        events = json.loads(body)["data"]["events"]
        (placed,) = [e for e in events if e["kind"] == "placed"]
        assert placed["detail"]["assignment"] == [{"host": "h1", "gpus": [0, 1, 2, 3]}]
        # No placement leader here: the page says so and still shows the log's history.
        assert "data-error" in page and "placement leader" in page
        assert "default-src 'none'" in headers["Content-Security-Policy"]

        # Owed vs delivered: nlp waited 10 s then ran 3590 s, 4 GPUs, within its share (4 of
        # 8 GPUs): owed 4 x 3600 GPU-s, delivered 4 x 3590, over both windows.
        status, body, _ = await _get(http, base + "/api/owed")
        doc = json.loads(body)
        assert status == 200 and doc["page"] == "owed"
        for label in ("last day", "last week"):
            rows = {r["allocation"]: r for r in doc["data"]["windows"][label]["rows"]}
            assert rows["nlp"]["owed_gpu_h"] == pytest.approx(4.0, abs=1e-6)
            assert rows["nlp"]["delivered_gpu_h"] == pytest.approx(4 * 3590 / 3600, abs=1e-6)
            assert rows["vision"]["delivered_gpu_h"] < rows["vision"]["owed_gpu_h"]
        assert 'data-allocation="nlp"' in doc["html"]
        # Unallocated goodput per window (nothing unallocated ran here: zero, no ratio).
        for label in ("last day", "last week"):
            goodput = doc["data"]["unallocated_goodput"][label]
            assert (goodput["gpu_h"], goodput["goodput_fraction"]) == (0.0, None)
        assert 'data-goodput-window="last day"' in doc["html"]

        # Every page renders (200), and none holds a URL: nothing to fetch from anywhere.
        for path in (*PAGES, "/workload/vic"):
            status, page, headers = await _get(http, base + path)
            assert status == 200, (path, status, page[:300])
            assert page.startswith("<!DOCTYPE html>"), path
            assert "://" not in page, f"{path} holds a URL"
            assert headers["Content-Type"].startswith("text/html"), path
            api = "/api" + (path.split("?")[0] if path.split("?")[0] != "/" else "/fairshare")
            status, body, _ = await _get(http, base + api)
            assert status == 200 and json.loads(body)["html"], api

        # The log starts about 2 h ago: the fair share page picks the 1-day window, and a
        # week asked for starts its axis at the first record, not 7 days back.
        page = (await _get(http, base + "/"))[1]
        assert "<strong>1d</strong>" in page and "picked to hold the whole history" in page
        page = (await _get(http, base + "/?window=7d"))[1]
        starts = {float(x) for x in _attrs(page, "data-chart-from-s")}
        assert starts and max(starts) <= 3 * 3600, starts

        # Metrics: the Prometheus text format, from the same log.
        status, text, headers = await _get(http, base + "/metrics")
        assert status == 200
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert 'allot_preemptions_total{reason="better-ranked"} 1.0' in text

        # Bad input names the field.
        for path, field, code in (
            ("/workload/no-such-workload", None, 404),
            ("/workload/bad.id", "workload_id", 400),
            ("/?window=3y", "window", 400),
            ("/api/fairshare?window=", None, 200),
        ):
            status, body, _ = await _get(http, base + path)
            assert status == code, (path, status, body[:200])
            if field is not None:
                assert json.loads(body)["error"]["field"] == field, body
        for raw, field in (
            (b'{"type": "OwedQuery", "window_s": 0}', "window_s"),
            (b'{"type": "OwedQuery", "bucket_s": 5}', "bucket_s"),
            (b'{"type": "OwedQuery", "colour": 1}', "colour"),
            (b"{not json", "body"),
        ):
            reply = _REJECTED.decode((await nc.request(s.QUERY_OWED, raw, timeout=5)).data)
            assert isinstance(reply, m.CommandRejected) and reply.field == field, (raw, reply)
    finally:
        await service_main.stop(service)
        await nc.close()


async def _submit(js: JetStreamContext, wid: str, alloc: str | None, gpus: int, at: float) -> None:
    await bus.publish(js, s.events(alloc, wid, "submitted"), submitted(wid, alloc, gpus, at))


async def test_queue_and_hosts_pages_agree_with_the_placement_leader(
    paged_log: str, http: aiohttp.ClientSession
) -> None:
    nc, js = await bus.connect(paged_log, "test-dashboard")
    await seed(js, {"h1": 8, "h2": 8})
    placement = PlacementService(paged_log, lease_ttl_s=1.0, name="p1", tracing=False)
    dashboard = DashboardService(paged_log, http_port=0, query_timeout_s=2.0, tracing=False)
    await service_main.start(placement)
    await service_main.start(dashboard)
    base = dashboard.url
    try:
        now = time.time()
        jobs = [  # (id, allocation, GPUs): the first two fill both hosts, the rest wait
            ("run-nlp", "nlp", 8),
            ("run-vis", "vision", 8),
            ("wait-nlp", "nlp", 4),
            ("wait-vis", "vision", 2),
            ("wait-free", None, 1),
        ]
        async with Client(paged_log) as c:

            async def hosts() -> m.HostsSnapshot | None:  # None until a leader answers
                try:
                    return await c.hosts()
                except NoResponderError:
                    return None

            for i, (wid, alloc, gpus) in enumerate(jobs):
                await _submit(js, wid, alloc, gpus, now + i * 0.01)
                if i == 1:
                    await eventually(
                        hosts, lambda h: h is not None and all(r.free_gpus == 0 for r in h.hosts)
                    )
            queue = await eventually(c.queue, lambda q: q.total == 3)
            leader_order = [r.workload_id for r in queue.rows]

            status, page, _ = await _get(http, base + "/queue")
            assert status == 200
            assert _attrs(page, "data-workload-id") == leader_order
            assert _attrs(page, "data-position") == ["1", "2", "3"]
            assert "What priority means now" in page
            doc = json.loads((await _get(http, base + "/api/queue"))[1])
            assert doc["data"]["order"] == leader_order

            status, page, _ = await _get(http, base + "/")
            held = dict(re.findall(r'data-allocation="(\w+)".*?data-held="(\d+)"', page))
            assert held["nlp"] == "8" and held["vision"] == "8", held

            # Drain the host running nlp's work: its deadline is that work's protection end.
            run = await c.status("run-nlp")
            host = run.assignment[0].host
            assert run.protected_until is not None
            await bus.publish(js, s.host_state(host), m.HostDraining(host=host, at=time.time()))

            async def host_row() -> str:
                page = (await _get(http, base + "/hosts"))[1]
                row = re.search(rf'<tr data-host="{host}"[^>]*>', page)
                return row.group() if row else ""

            # The drain and its deadline (the leader's, once it has read the drain) may
            # reach the page one refresh apart.
            row = await eventually(
                host_row, lambda r: 'data-state="draining"' in r and "data-deadline=" in r
            )
            deadline = float(re.findall(r'data-deadline="([\d.]+)"', row)[0])
            assert deadline == pytest.approx(run.protected_until, abs=1e-3)
    finally:
        await service_main.stop(dashboard)
        await service_main.stop(placement)
        await nc.close()


def test_every_preemption_reason_has_its_meaning_on_the_workload_page() -> None:
    """A reason added to the wire without a line here would show as a bare code."""
    assert set(PREEMPT_TEXT) == set(get_args(m.PreemptReason))


async def test_a_team_sees_its_workload_before_the_dashboards_log_has_it(fresh_log: str) -> None:
    """A team's workload page asked for while the dashboard's own log follower is behind the
    placement leader (whose queue already lists the workload): the leader's status says
    whose it is, so the team sees its own workload (not a 404) and still not another's.
    Here the dashboard's timeline has read nothing at all (the race, held open)."""
    nc, js = await bus.connect(fresh_log, "test-dashboard")
    await seed(js, {"h1": 8})
    placement = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", tracing=False)
    await service_main.start(placement)
    try:
        now = time.time()
        for i, (wid, alloc) in enumerate((("mine", "nlp"), ("theirs", "vision"))):
            await _submit(js, wid, alloc, 8, now + i * 0.01)
        async with Client(fresh_log) as c:

            async def queue() -> m.QueueSnapshot | None:  # None until a leader answers
                try:
                    return await c.queue()
                except NoResponderError:
                    return None

            await eventually(queue, lambda q: q is not None and q.total == 1)  # one waits
            views = DashboardViews(c, LogTimeline())
            nlp = Viewer("nlp", "team", frozenset({"nlp"}))
            mine = await views.workload(time.time(), "mine", nlp)
            assert mine.status == 200 and mine.data["state"] in ("running", "pending")
            assert (await views.workload(time.time(), "theirs", nlp)).status == 404
            assert (await views.workload(time.time(), "nobody", nlp)).status == 404
            admin = Viewer("admin", "admin")
            assert (await views.workload(time.time(), "theirs", admin)).status == 200
    finally:
        await service_main.stop(placement)
        await nc.close()
