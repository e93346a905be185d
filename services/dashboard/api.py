"""What every dashboard page is made of: the fetches behind it and its JSON document.

``DashboardViews`` answers one page at a time: it asks the services over NATS through the
SDK (placement leader: queue, hosts, allocations, status; ranking: share), reads the log's
history from the dashboard's own ``LogTimeline`` (held-vs-entitlement series, a workload's
events, owed vs delivered, drain deadlines), and hands both to the page renderers
(``allot.services.dashboard.pages``, ``allot.services.dashboard.workload``). A service that does not
answer within ``timeout_s`` turns into an error banner on the page, never into a failed
page: the rest still renders.

``metrics(now)`` is the body of ``/metrics``: ``metrics.render_metrics`` of the
same answers (queue, ranking, allocations, the leader's cycle histogram) and the timeline;
a missing answer leaves out only the metrics that need it.

``api_document(view)`` is the JSON of ``/api/<page>``: ``{"page", "at", "title", "html",
"data"}``; ``html`` is the page's live region (what the page script swaps in), ``data``
the facts behind it (snapshots as their wire JSON).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import msgspec
import structlog

from allot.auth.dashboard import EVERYONE, Viewer
from allot.core.errors import ValidationError
from allot.eventlog.idle_book import IdleBook
from allot.eventlog.logfold import LogFold
from allot.eventlog.owed_query import owed_snapshot
from allot.eventlog.timeline import LogTimeline
from allot.proto import messages as m
from allot.proto import subjects
from allot.sdk import Client
from allot.sdk.errors import SdkError
from allot.services.dashboard.frame import PageView
from allot.services.dashboard.metrics import (
    IdleCounter,
    MetricsInputs,
    QueueWaitHistogram,
    render_metrics,
)
from allot.services.dashboard.pages import (
    WINDOWS,
    DrainDeadline,
    fairshare_page,
    hosts_page,
    owed_page,
    pick_window,
    queue_page,
)
from allot.services.dashboard.workload import workload_page
from allot.sim.report import unallocated_goodput

T = TypeVar("T")

log = structlog.get_logger("allot.dashboard")

OWED_WINDOWS: tuple[tuple[str, float], ...] = (("last day", 86400.0), ("last week", 7 * 86400.0))

HISTORY_TTL_S = 5.0
"""History figures (owed vs delivered, held-vs-entitlement series) are recomputed at most
this often, whatever the number of open pages polling them: they are buckets of the past,
and one takes up to a fraction of a second on the event loop that also follows the log
(docs/decisions/0023)."""


def parse_window(text: str | None) -> str | None:
    """The fair-share chart window named in ``?window=``; None when absent (the page picks
    one from the history)."""
    if text is None or text == "":
        return None
    if text not in WINDOWS:
        raise ValidationError("window", f"must be one of {', '.join(WINDOWS)}, got {text!r}")
    return text


def check_workload_id(text: str) -> str:
    """A workload id as the wire allows it (a subject token), else ``ValidationError``."""
    return subjects.validate_token(text, "workload_id")


def api_document(view: PageView) -> dict[str, Any]:
    return {
        "page": view.page,
        "at": view.at,
        "title": view.title,
        "html": view.html,
        "data": view.data,
    }


def drain_deadlines(fold: LogFold) -> dict[str, DrainDeadline]:
    """Per draining host: the latest moment its work must be gone, from the log. A workload
    under notice leaves by its notice deadline; one still protected is noticed when its
    protection ends (then gets the grace period, which the placement leader knows and we
    do not); one past its protection and not yet noticed is noticed at the next cycle."""
    st = fold.state
    out: dict[str, DrainDeadline] = {}
    for host in st.host_ids:
        if host not in st.draining:
            continue
        items: list[tuple[str, float, str]] = []
        for wid in sorted(st.on_host.get(host, ())):
            run = st.running.get(wid)
            if run is None:
                continue
            if run.preempt_at is not None:
                items.append((wid, run.preempt_at, "notice deadline"))
            else:
                items.append((wid, run.protected_until, "protected until"))
        deadline = max((t for _, t, _ in items), default=None)
        out[host] = DrainDeadline(host, deadline, tuple(items))
    return out


def workload_labels(fold: LogFold, viewer: Viewer = EVERYONE) -> dict[str, str]:
    """Running workload -> "allocation, GPUs" (what a hosts table says about each); only the
    workloads ``viewer`` may see are labelled (the others stay opaque ids)."""
    out = {}
    for wid, run in fold.state.running.items():
        w = run.workload
        if not viewer.sees(w.allocation):
            continue
        noticed = ", under notice" if run.preempt_at is not None else ""
        out[wid] = f"{w.allocation or 'unallocated'}, {w.gpus} GPUs{noticed}"
    return out


class DashboardViews:
    """One method per page; each returns a ``PageView`` (see the module docstring)."""

    def __init__(
        self,
        client: Client,
        timeline: LogTimeline,
        timeout_s: float = 2.0,
        idle: IdleBook | None = None,
    ) -> None:
        self.client = client
        self.timeline = timeline
        self.idle = IdleBook() if idle is None else idle
        """Idle stretches from USAGE (``allot.eventlog.idle_book``)."""
        self.timeout_s = timeout_s
        self._history: dict[tuple[object, ...], tuple[float, Any]] = {}
        # Kept for the process's life: a Prometheus histogram must never go down, and the
        # timeline forgets placements older than its horizon.
        self.queue_waits = QueueWaitHistogram()
        self.idle_counter = IdleCounter()

    def _recent(self, key: tuple[object, ...], now: float, compute: Callable[[], T]) -> T:
        """``compute()``, or its value from less than ``HISTORY_TTL_S`` ago."""
        hit = self._history.get(key)
        if hit is not None and 0.0 <= now - hit[0] < HISTORY_TTL_S:
            value: T = hit[1]
            return value
        value = compute()
        self._history[key] = (now, value)
        return value

    async def _ask(
        self, call: Callable[..., Awaitable[T]], what: str, errors: list[str]
    ) -> T | None:
        try:
            return await call(timeout=self.timeout_s)
        except SdkError as e:
            errors.append(f"{what}: {e}")
            return None

    async def fairshare(self, now: float, window: str | None) -> PageView:
        """``window`` None: the shortest that holds the whole history (``pick_window``)."""
        errors: list[str] = []
        ranking, allocations = await asyncio.gather(
            self._ask(self.client.share, "ranking service", errors),
            self._ask(self.client.allocations, "placement leader", errors),
        )
        first = self.timeline.first if math.isfinite(self.timeline.first) else None
        chosen = window or pick_window(0.0 if first is None else now - first)
        window_s, bucket_s = WINDOWS[chosen]
        series = self._recent(
            ("held", chosen), now, lambda: self.timeline.held_series(now, window_s, bucket_s)
        )
        return fairshare_page(
            now,
            ranking,
            allocations,
            series,
            window=chosen,
            first=first,
            picked=window is None,
            errors=errors,
        )

    async def queue(self, now: float, viewer: Viewer = EVERYONE) -> PageView:
        errors: list[str] = []
        scopes = viewer.scopes
        if scopes is None:
            snapshot = await self._ask(self.client.queue, "placement leader", errors)
        else:
            snapshot = await self._scoped_queue(scopes, errors)
        return queue_page(now, snapshot, errors)

    async def _scoped_queue(
        self, scopes: Sequence[str], errors: list[str]
    ) -> m.QueueSnapshot | None:
        """A team's queue: its allocations' rows, asked on the per-allocation subjects (the
        ones NATS grants it), merged in service order."""
        parts = await asyncio.gather(
            *(
                self._ask(partial(self.client.queue, scope=scope), "placement leader", errors)
                for scope in scopes
            )
        )
        got = [p for p in parts if p is not None]
        if not got:
            return None
        rows = sorted((r for p in got for r in p.rows), key=lambda r: r.position)
        return msgspec.structs.replace(got[0], rows=tuple(rows), total=sum(p.total for p in got))

    async def workload(self, now: float, workload_id: str, viewer: Viewer = EVERYONE) -> PageView:
        errors: list[str] = []
        scopes = viewer.scopes
        if scopes is None:
            current = await self._ask(
                partial(self.client.status, workload_id), "placement leader", errors
            )
        else:
            # A team asks the leader on its own allocations' subjects, whether or not this
            # dashboard's log has the workload yet (its follower may be a moment behind the
            # leader, whose queue already lists it): another team's workload is "unknown"
            # there, answered as fast as an id nobody knows.
            answers = await asyncio.gather(
                *(
                    self._ask(
                        partial(self.client.status, workload_id, scope=scope),
                        "placement leader",
                        errors,
                    )
                    for scope in scopes
                )
            )
            current = next((a for a in answers if a is not None and a.state != "unknown"), None)
            errors = list(dict.fromkeys(errors))  # one line for a leader that did not answer
            rec = self.timeline.fold.records.get(workload_id)
            if current is None and (rec is None or not viewer.sees(rec.workload.allocation)):
                # Another team's workload reads as an unknown one: not even its id is
                # confirmed.
                return workload_page(now, workload_id, None, ())
        row = None
        if current is not None and current.state == "pending":
            snapshot = await self._ask(self.client.queue, "placement leader", errors)
            rows = snapshot.rows if snapshot is not None else ()
            row = next((r for r in rows if r.workload_id == workload_id), None)
        events = self.timeline.events(workload_id)
        return workload_page(now, workload_id, current, events, queue_row=row, errors=errors)

    async def hosts(self, now: float, viewer: Viewer = EVERYONE) -> PageView:
        errors: list[str] = []
        snapshot = await self._ask(self.client.hosts, "placement leader", errors)
        fold = self.timeline.fold
        labels = workload_labels(fold, viewer)
        return hosts_page(now, snapshot, drain_deadlines(fold), labels=labels, errors=errors)

    async def owed(self, now: float, viewer: Viewer = EVERYONE) -> PageView:
        def compute() -> list[tuple[str, m.OwedSnapshot]]:
            return [
                (
                    label,
                    owed_snapshot(self.timeline, m.OwedQuery(window_s=window_s), now, self.idle),
                )
                for label, window_s in OWED_WINDOWS
            ]

        def goodput() -> list[tuple[str, dict[str, Any]]]:
            return [
                (label, unallocated_goodput(self.timeline.sim_record(now, window_s)))
                for label, window_s in OWED_WINDOWS
            ]

        windows = self._recent(("owed",), now, compute)
        # The runs flagged idle now: every one to a login that sees every allocation, a
        # team's own to a team (who runs what is not public; idle GPU-hours are).
        scopes = viewer.scopes
        flagged = [
            stretch
            for stretch in self.idle.open_stretches()
            if scopes is None or stretch.allocation in scopes
        ]
        return owed_page(
            now, windows, goodput=self._recent(("goodput",), now, goodput), idle=flagged
        )

    async def metrics(self, now: float) -> bytes:
        errors: list[str] = []
        queue, ranking, allocations, stats = await asyncio.gather(
            self._ask(self.client.queue, "placement leader", errors),
            self._ask(self.client.share, "ranking service", errors),
            self._ask(self.client.allocations, "placement leader", errors),
            self._ask(self.client.placement_stats, "placement leader", errors),
        )

        def inputs(stats: m.PlacementStats | None) -> MetricsInputs:
            return MetricsInputs(
                timeline=self.timeline,
                now=now,
                queue=queue,
                ranking=ranking,
                allocations=allocations,
                placement_stats=stats,
                queue_waits=self.queue_waits,
                idle=self.idle,
                idle_counter=self.idle_counter,
            )

        try:
            checked = inputs(stats)
        except ValidationError as e:
            # A malformed histogram from the leader: export everything else without it.
            log.warning("placement stats dropped", field=e.field, reason=e.reason)
            checked = inputs(None)
        return render_metrics(checked)
