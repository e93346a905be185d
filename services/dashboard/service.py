"""Dashboard: the live web pages of the stack, ``allot owed`` and ``/metrics``.

Follows the log through the history pages the ranking service answers it alone
(``allot.v1.dashboard.log``; ``allot.services.dashboard.log_pages``: HOSTS and the budget
trees before the WORKLOADS records stored after them, read every ``READ_EVERY_S``), never
the JetStream API, into a ``LogTimeline``: the fold plus the history the pages need (GPU
segments, waits, notices with their reasons, capacity changes, per-workload events), and
the idle records of USAGE (``allot.v1.usage.idle.*.*``, written by the health service) into
an ``IdleBook``. Once replayed it answers ``allot.v1.query.owed`` (``OwedQuery`` ->
``OwedSnapshot``, or ``CommandRejected`` naming the field) and reports healthy.

HTTP (aiohttp) on ``--http-host`` (default 127.0.0.1: loopback only) ``--http-port``
(default 8265):

=====================  =====================================================================
``/``                  fair share: the budget tree, shares, fairshare factor, held vs
                       entitlement now and over a window (``?window=7d``, ``1d``, ``1h``;
                       by default the shortest that holds the whole history)
``/queue``             pending work in the leader's order, the order's inputs, reasons, est.
``/workload/<id>``     one workload's timeline from the log, and why it waits
``/hosts``             host states, drains and their deadlines
``/owed``              owed vs delivered GPU-hours per allocation, last day and week, idle
                       GPU-hours, and the runs flagged idle now (a team: its own)
``/api/<page>``        the same as JSON (``allot.services.dashboard.api.api_document``); each
                       page polls its own every 2 s
``/metrics``           Prometheus text (``allot.services.dashboard.metrics``)
``/healthz``           200 once the log is replayed and while it is followed, 503 else
=====================  =====================================================================

With ``--users dashboard-users.json`` (from ``allot auth gen``) every page but ``/healthz``
asks for a login and shows a team only its own work (``allot.auth.dashboard``).

Pages ask the placement leader and the ranking service through the SDK on each request
(a page whose source does not answer shows a banner and the rest). No page loads anything
from another origin (see ``allot.services.dashboard.frame``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import structlog
from aiohttp import web
from nats.aio.client import Client as NatsClient

from allot import bus
from allot.auth.dashboard import EVERYONE, Access, Viewer
from allot.bus.request_server import RequestServer
from allot.bus.runtime import configure_logging, make_broker, tracer_provider, wall_clock
from allot.bus.service_main import base_parser, positive_seconds, run_main
from allot.core.errors import ValidationError
from allot.eventlog.idle_book import IdleBook
from allot.eventlog.owed_query import owed_snapshot
from allot.eventlog.timeline import LogTimeline
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import Client
from allot.services.dashboard.api import (
    DashboardViews,
    api_document,
    check_workload_id,
    parse_window,
)
from allot.services.dashboard.frame import CSP, PageView, document
from allot.services.dashboard.log_pages import PagedLogFollower
from allot.services.dashboard.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

OPEN_PATHS = frozenset({"/healthz", "/favicon.ico"})
VIEWER = web.RequestKey("viewer", Viewer)
"""Request key of the logged-in ``Viewer``."""
DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8265
OWED_PENDING = 16
"""``allot owed`` requests that may wait (one is answered at a time: its fold is CPU work on
the pages' own event loop); more are dropped and their askers time out, so a team's flood
cannot hold the pages back (decision 0080)."""
OWED_FRESH_S = 1.0
"""An answer is reused this long for the same question: a flood of one question costs one
answer a second."""
OWED_KEPT = 16
"""Answers kept for reuse, one per question; past that all are dropped (many distinct
questions at once are bounded by ``OWED_PENDING`` instead)."""
READ_EVERY_S = 0.5
"""The log is read this often once replayed (a round of four history pages; pages poll
every 2 s)."""

_ENC = msgspec.json.Encoder()

log = structlog.get_logger("allot.dashboard")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class DashboardService:
    def __init__(
        self,
        nats_url: str,
        *,
        http_host: str = DEFAULT_HTTP_HOST,
        http_port: int = DEFAULT_HTTP_PORT,
        query_timeout_s: float = 2.0,
        tracing: bool = True,
        access: Access | None = None,
    ) -> None:
        if not 0 <= http_port <= 65535:
            raise ValidationError("http_port", f"must be 0-65535, got {http_port}")
        self.nats_url = nats_url
        self.access = access
        """Logins (``--users``); None: every page to whoever reaches the port."""
        self.http_host = http_host
        self.http_port = http_port
        provider = tracer_provider("dashboard") if tracing else None
        self.broker = make_broker(nats_url, "dashboard", provider)
        self.timeline = LogTimeline()
        self.idle = IdleBook()
        """The idle records (USAGE), for ``allot owed``, the owed page and ``/metrics``."""
        self.client = Client(nats_url, name="allot-dashboard", timeout=query_timeout_s, retries=0)
        self.views = DashboardViews(self.client, self.timeline, query_timeout_s, self.idle)
        self.nc: NatsClient | None = None
        self.follower: PagedLogFollower | None = None
        self.caught_up = False
        self.records = 0
        self._owed: RequestServer | None = None
        self._owed_answers: dict[bytes, tuple[float, bytes]] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""
        """``http://host:port`` once serving (the bound port when ``http_port`` is 0)."""

    # ------------------------------------------------------------------ lifecycle
    async def on_started(self) -> None:
        await self._serve_http()  # /healthz says 503 while the log replays
        self.nc, _js = await bus.connect(self.nats_url, "allot-dashboard")
        await self.client.open()
        # The log through the ranking service's pages only: the dashboard's login has no
        # JetStream API (``allot auth gen``; decision 0080).
        self.follower = PagedLogFollower(
            self.client, self._on_record, self._on_idle_record, every_s=READ_EVERY_S
        )
        await self.follower.start()
        self._owed = RequestServer(
            self.nc,
            s.QUERY_OWED,
            "dashboard-owed",
            self._answer_owed,
            max_in_flight=1,
            max_pending=OWED_PENDING,
        )
        # Healthy (/healthz) once the owed query is served too: its start confirms the
        # subscription is on the server. Inbox replies only, as every request server.
        await self._owed.start()
        self.caught_up = True
        log.info("log replayed", records=self.records, url=self.url)

    async def on_stopping(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._owed is not None:
            await self._owed.stop()
            self._owed = None
        if self.follower is not None:
            await self.follower.stop()
        await self.client.close()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()

    def _on_idle_record(self, _subject: str, record: msgspec.Struct) -> None:
        self.idle.apply(record)

    def _on_record(self, _subject: str, record: msgspec.Struct) -> None:
        self.timeline.apply(record)
        self.records += 1

    # ------------------------------------------------------------------ allot owed
    async def _answer_owed(self, _subject: str, body: bytes) -> bytes:
        now = wall_clock()
        reused = self._owed_answers.get(body)
        if reused is not None and 0 <= now - reused[0] < OWED_FRESH_S:
            return reused[1]
        try:
            query = codec.decode_as(m.OwedQuery, body)
            reply: msgspec.Struct = owed_snapshot(self.timeline, query, now, self.idle)
        except ValidationError as e:
            reply = m.CommandRejected(at=now, field=e.field, reason=e.reason)
        answer = _ENC.encode(reply)
        if len(self._owed_answers) >= OWED_KEPT:
            self._owed_answers.clear()
        self._owed_answers[body] = (now, answer)
        return answer

    # ------------------------------------------------------------------ HTTP
    async def _serve_http(self) -> None:
        app = web.Application(middlewares=[_headers, self._login])
        routes: list[tuple[str, Handler]] = [
            ("/", self._page(lambda r, now: self.views.fairshare(now, _window(r)))),
            ("/queue", self._page(lambda r, now: self.views.queue(now, _viewer(r)))),
            ("/hosts", self._page(lambda r, now: self.views.hosts(now, _viewer(r)))),
            ("/owed", self._page(lambda r, now: self.views.owed(now, _viewer(r)))),
            ("/workload/{workload_id}", self._page(self._workload)),
            ("/api/fairshare", self._api(lambda r, now: self.views.fairshare(now, _window(r)))),
            ("/api/queue", self._api(lambda r, now: self.views.queue(now, _viewer(r)))),
            ("/api/hosts", self._api(lambda r, now: self.views.hosts(now, _viewer(r)))),
            ("/api/owed", self._api(lambda r, now: self.views.owed(now, _viewer(r)))),
            ("/api/workload/{workload_id}", self._api(self._workload)),
            ("/metrics", self._metrics),
            ("/healthz", self._healthz),
            ("/favicon.ico", _no_content),
        ]
        for path, handler in routes:
            app.router.add_get(path, handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.http_host, self.http_port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        log.info("serving", url=self.url)

    def _workload(self, request: web.Request, now: float) -> Awaitable[PageView]:
        wid = check_workload_id(request.match_info["workload_id"])
        return self.views.workload(now, wid, _viewer(request))

    @web.middleware
    async def _login(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """HTTP Basic against ``--users`` (``allot.auth.dashboard``); /healthz stays
        open for health checks."""
        if self.access is None or request.path in OPEN_PATHS:
            request[VIEWER] = EVERYONE
            return await handler(request)
        viewer = self.access.check(request.headers.get("Authorization"))
        if viewer is None:
            return web.json_response(
                {
                    "error": "log in with your Allot user and your dashboard password "
                    "(ALLOT_DASHBOARD_PASSWORD in your credentials file)"
                },
                status=401,
                headers={"WWW-Authenticate": 'Basic realm="allot", charset="UTF-8"'},
            )
        if not viewer.allowed:
            return web.json_response({"error": f"role {viewer.role!r} sees no pages"}, status=403)
        request[VIEWER] = viewer
        return await handler(request)

    def _page(self, build: Callable[[web.Request, float], Awaitable[PageView]]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            view = await self._view(request, build)
            if isinstance(view, web.Response):
                return view
            api = "/api" + (request.path if request.path != "/" else "/fairshare")
            if request.query_string:
                api += "?" + request.query_string
            return web.Response(
                text=document(view, api), content_type="text/html", status=view.status
            )

        return handler

    def _api(self, build: Callable[[web.Request, float], Awaitable[PageView]]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            view = await self._view(request, build)
            if isinstance(view, web.Response):
                return view
            return web.json_response(api_document(view), status=view.status, dumps=_dumps)

        return handler

    async def _view(
        self, request: web.Request, build: Callable[[web.Request, float], Awaitable[PageView]]
    ) -> PageView | web.Response:
        if not self.caught_up:
            return web.json_response(
                {"error": "the dashboard is still replaying the log"}, status=503
            )
        try:
            return await build(request, wall_clock())
        except ValidationError as e:
            return web.json_response({"error": {"field": e.field, "reason": e.reason}}, status=400)

    async def _metrics(self, _request: web.Request) -> web.StreamResponse:
        if not self.caught_up:
            return web.Response(status=503, text="the dashboard is still replaying the log")
        body = await self.views.metrics(wall_clock())
        return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def _healthz(self, _request: web.Request) -> web.StreamResponse:
        # Unhealthy too once the log is no longer followed (the pages would freeze).
        following = self.follower is not None and self.follower.following
        body = {"caught_up": self.caught_up, "following": following, "records": self.records}
        return web.json_response(body, status=200 if self.caught_up and following else 503)

    def stats(self) -> dict[str, Any]:
        return {"caught_up": self.caught_up, "records": self.records, "url": self.url}


def _viewer(request: web.Request) -> Viewer:
    viewer: Viewer = request.get(VIEWER, EVERYONE)
    return viewer


def _window(request: web.Request) -> str | None:
    return parse_window(request.query.get("window"))


def _dumps(obj: Any) -> str:
    return json.dumps(obj, allow_nan=False, separators=(",", ":"))


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


async def _no_content(_request: web.Request) -> web.StreamResponse:
    return web.Response(status=204)


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = base_parser("python -m allot.services.dashboard", __doc__)
    ap.add_argument(
        "--http-host",
        default=DEFAULT_HTTP_HOST,
        help="address to serve on (default %(default)s: this machine only; 0.0.0.0 in a "
        "container whose port is published)",
    )
    ap.add_argument(
        "--http-port", type=port_number, default=DEFAULT_HTTP_PORT, help="HTTP port (0: any free)"
    )
    ap.add_argument(
        "--users",
        help="dashboard-users.json from `allot auth gen`: require a login (HTTP Basic, the "
        "users' dashboard passwords, not their NATS ones) and show each team only its own "
        "work",
    )
    ap.add_argument(
        "--query-timeout-s",
        type=positive_seconds,
        default=2.0,
        help="how long a page waits for placement or ranking to answer",
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging("dashboard")
    return run_main(
        lambda a: DashboardService(
            a.nats_url,
            http_host=a.http_host,
            http_port=a.http_port,
            query_timeout_s=a.query_timeout_s,
            access=Access.load(a.users) if a.users else None,
        ),
        build_parser(),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
