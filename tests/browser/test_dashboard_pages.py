"""The web dashboard in a real browser, against the whole stack (``allot up``'s processes on
embedded NATS and Redis) running a scripted preemption:

1. nlp holds the whole cluster (2 fake hosts x 8 GPUs): 8 GPUs protected for 10 min, and
   the victim, 8 GPUs protected for 3 s;
2. vision, holding nothing and owed GPUs, asks for 4: once the victim's protection has
   ended it gets a ``reclaimed-for-entitlement`` notice for vision's workload, leaves
   within the 2 s grace period and is requeued (nlp, still over its entitlement with the
   other 8 GPUs, queues behind vision, so the victim does not come straight back);
3. ads fills the 4 GPUs left (protected 10 min), and five more workloads queue;
4. a budget change re-ranks with the usage charged so far, so the allocations' fairshare
   factors differ (search and speech idle, ads below nlp's and vision's use of their shares).

Checked: every page loads, refreshes itself, and no request leaves localhost (every request
the page makes is recorded); the queue page's order equals ``allot queue --json``; what
each page and ``allot queue/prio/share [-l]`` says about who is served first (position 1,
fairshare factor 1, Slurm's rank with its legend) agrees with the leader's order; the
preemption appears on the victim's workload page with its reason and its preemptor; the
pages follow the stack live (a new submission appears on the open queue page; a drain and
its deadline on the open hosts page). Screenshots of every page are saved as artifacts.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, Request

from allot.ops.stack import AgentSpec, Stack, StackConfig
from allot.proto import messages as m
from allot.sdk import Client

pytestmark = [pytest.mark.browser, pytest.mark.integration]

T = TypeVar("T")
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


@dataclass(frozen=True)
class Scene:
    stack: Stack
    url: str
    nats_url: str
    running: tuple[str, ...]
    victim: str
    preemptor: str
    waiting: tuple[str, ...]


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a loop of its own: Playwright's sync API keeps an event
    loop running in the test's thread, so ``asyncio.run`` must not be called there."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _until(
    probe: Callable[[], Awaitable[T]], ok: Callable[[T], bool], what: str, timeout: float = 30.0
) -> T:
    deadline = time.monotonic() + timeout
    value = await probe()
    while not ok(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"scenario: no {what} after {timeout:.0f} s (last: {value!r})")
        await asyncio.sleep(0.1)
        value = await probe()
    return value


@dataclass(frozen=True)
class Script:
    keeper: str
    victim: str
    preemptor: str
    filler: str
    waiting: tuple[str, ...]
    notices: list[tuple[str, str, str | None]]


async def _script(nats_url: str) -> Script:
    async with Client(nats_url) as c:
        notices: list[m.PreemptionNotice] = []
        sub = await c.on_preemption(notices.append)
        # nlp holds the whole cluster: 8 GPUs protected for 10 min, 8 for 3 s (the victim).
        keeper = (
            await c.submit(
                client_id="keeper",
                user="ann",
                allocation="nlp",
                gpus=8,
                min_runtime_s=600,
                duration_s=3600,
            )
        ).workload_id
        victim = (
            await c.submit(
                client_id="victim",
                user="ann",
                allocation="nlp",
                gpus=8,
                min_runtime_s=3,
                duration_s=3600,
            )
        ).workload_id
        for wid in (keeper, victim):
            await _until(lambda w=wid: c.status(w), lambda s: s.state == "running", "nlp runs")
        preemptor = (
            await c.submit(
                client_id="vision-1",
                user="bo",
                allocation="vision",
                gpus=4,
                min_runtime_s=600,
                duration_s=3600,
            )
        ).workload_id
        await _until(
            lambda: asyncio.sleep(0, notices), lambda ns: len(ns) > 0, "notice", timeout=30
        )
        await _until(
            lambda: c.status(victim),
            lambda s: s.state == "pending" and s.attempt == 1,
            "victim requeued",
        )
        await _until(lambda: c.status(preemptor), lambda s: s.state == "running", "vision runs")
        filler = (
            await c.submit(
                client_id="ads-1",
                user="cy",
                allocation="ads",
                gpus=4,
                min_runtime_s=600,
                duration_s=3600,
            )
        ).workload_id
        await _until(lambda: c.status(filler), lambda s: s.state == "running", "ads runs")
        waiting = []
        for i, (alloc, gpus) in enumerate(
            [("search", 4), ("speech", 2), ("nlp", 4), (None, 2), ("ads", 2)]
        ):
            accepted = await c.submit(
                client_id=f"wait-{i}",
                user="dee",
                allocation=alloc,
                gpus=gpus,
                min_runtime_s=600 if alloc else 0,
                duration_s=3600,
            )
            waiting.append(accepted.workload_id)
        await _until(c.queue, lambda q: q.total == 6, "six pending")
        await sub.unsubscribe()
        await _rerank(c)
        return Script(
            keeper,
            victim,
            preemptor,
            filler,
            tuple(waiting),
            [(n.workload_id, n.reason, n.preemptor) for n in notices],
        )


async def _rerank(c: Client) -> None:
    """Rank again with the usage charged so far (a budget change ranks at once; setting a
    share to its value changes nothing else), until every allocation that ran has usage,
    then wait for the leader's queue to carry the new factors."""
    running = {"nlp", "vision", "ads"}

    async def ranked() -> m.RankingUpdated:
        await c.set_budget(("root", "product", "search"), 50, set_by="browser-test")
        await asyncio.sleep(0.5)
        return await c.share()

    ranking = await _until(
        ranked,
        lambda r: all(n.raw_usage > 0 for n in r.nodes if n.leaf and n.name in running),
        "usage charged to nlp, vision and ads",
    )
    factors = {n.name: n.fairshare for n in ranking.nodes if n.leaf}
    await _until(
        c.queue,
        lambda q: all(
            r.fairshare == factors.get(r.allocation or "") for r in q.rows if r.allocation
        ),
        "the leader's queue with the new factors",
    )


@pytest.fixture(scope="module")
def scene(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """The stack and its scripted story; ``browser`` first, so a missing Chromium fails the
    tests before a stack is started for nothing."""
    config = StackConfig(
        run_dir=tmp_path_factory.mktemp("stack"),  # embedded NATS and Redis of its own
        agents=(AgentSpec("fake-a", hosts=2, gpus=8),),
        grace_s=2,
        lease_ttl_s=2.0,
        rank_every_s=600.0,  # one ranking: the order does not move while we compare it
        accrue_s=2.0,
        slot_s=2.0,
    )
    with Stack(config) as stack:
        assert stack.dashboard_url is not None
        s = run_async(_script(stack.servers.nats_url))
        assert s.notices == [(s.victim, "reclaimed-for-entitlement", s.preemptor)], s.notices
        yield Scene(
            stack=stack,
            url=stack.dashboard_url,
            nats_url=stack.servers.nats_url,
            running=(s.keeper, s.preemptor, s.filler),
            victim=s.victim,
            preemptor=s.preemptor,
            waiting=s.waiting,
        )


@dataclass
class Opened:
    page: Page
    requests: list[str]
    problems: list[str]


@pytest.fixture
def open_page(browser: Browser) -> Iterator[Callable[[str], Opened]]:
    """``open_page(url)``: a fresh page that records every request it makes and every
    console error or script exception (a CSP violation is a console error)."""
    contexts = []

    def open_(url: str) -> Opened:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        contexts.append(context)
        page = context.new_page()
        opened = Opened(page, [], [])

        def on_request(request: Request) -> None:
            opened.requests.append(request.url)

        page.on("request", on_request)
        page.on(
            "console",
            lambda msg: (
                opened.problems.append(f"console {msg.type}: {msg.text}")
                if msg.type == "error"
                else None
            ),
        )
        page.on("pageerror", lambda exc: opened.problems.append(f"page error: {exc}"))
        response = page.goto(url)
        assert response is not None and response.status == 200, (
            f"{url}: HTTP {response.status if response else '(no response)'}"
        )
        return opened

    yield open_
    for context in contexts:
        context.close()


def _wait_refreshed(page: Page, times: int = 1) -> None:
    """Until the page's script has replaced the live region ``times`` times."""
    page.wait_for_function(
        "n => Number(document.body.dataset.refreshes || 0) >= n", arg=times, timeout=15_000
    )


def _off_host(urls: list[str]) -> list[str]:
    return [u for u in urls if urlsplit(u).hostname not in LOCAL_HOSTS]


PAGES = {  # screenshot name: (path, title)
    "fairshare": ("/", "Fair share"),
    "fairshare-1h": ("/?window=1h", "Fair share"),
    "queue": ("/queue", "Queue"),
    "hosts": ("/hosts", "Hosts"),
    "owed": ("/owed", "Owed vs delivered"),
    "workload-victim": ("/workload/{victim}", "Workload {victim}"),
}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_each_page_loads_refreshes_and_requests_only_localhost(
    scene: Scene,
    open_page: Callable[[str], Opened],
    screenshot: Callable[[Page, str], Path],
    name: str,
) -> None:
    path, title = PAGES[name]
    opened = open_page(scene.url + path.format(victim=scene.victim))
    page = opened.page
    assert page.locator("h1").inner_text() == title.format(victim=scene.victim)
    _wait_refreshed(page)  # the poll ran: its fetch is among the requests checked below
    assert page.locator("[data-error]").count() == 0, page.locator("[data-error]").all_inner_texts()
    assert opened.requests, "no request recorded at all"
    assert any("/api/" in u for u in opened.requests), opened.requests
    assert _off_host(opened.requests) == [], (
        f"requests left localhost: {_off_host(opened.requests)}"
    )
    assert opened.problems == [], opened.problems
    if name.startswith("fairshare"):
        leaves = page.locator("tr[data-allocation]")
        assert leaves.count() == 5, leaves.all_inner_texts()
        assert page.locator("[data-chart-allocation] svg").count() == 5
        held = page.locator('tr[data-allocation="nlp"] td[data-held]').get_attribute("data-held")
        assert held == "8"
    if name == "owed":
        assert page.locator("tr[data-allocation]").count() >= 3
        assert page.locator("[data-chart-window] svg").count() == 2
    if name == "hosts":
        assert page.locator("tr[data-host]").count() == 2
    saved = screenshot(page, name)
    print(f"screenshot: {saved}")


def _cli(nats_url: str, *args: str) -> str:
    """``allot <args>``'s output, run as a user would."""
    cli = Path(sys.executable).with_name("allot")
    argv = [str(cli)] if cli.exists() else [sys.executable, "-m", "allot.cli.main"]
    out = subprocess.run(
        [*argv, *args, "--nats-url", nats_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout


def _cli_queue(nats_url: str) -> list[str]:
    """``allot queue --json``'s order."""
    envelope = json.loads(_cli(nats_url, "queue", "--json"))
    assert envelope["kind"] == "QueueSnapshot", envelope
    return [row["workload_id"] for row in envelope["data"]["rows"]]


def _table(text: str, first: str, n: int) -> list[dict[str, str]]:
    """The ``n`` rows of the table whose header starts with ``first``, by column title (the
    columns compared here hold no blanks)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    titles = lines[start].split()
    return [dict(zip(titles, line.split(), strict=False)) for line in lines[start + 2 :][:n]]


TIERS = ("under-entitlement", "over-entitlement", "unallocated")
NODES = 7
"""Rows of ``allot share``: the default budget tree's two programs and five teams."""


def test_every_page_and_command_states_the_order_the_leader_serves(
    scene: Scene, open_page: Callable[[str], Opened]
) -> None:
    """The leader serves by tier, then fairshare factor (1 = first); each surface that
    shows the order's inputs says so, and the numbers it shows reproduce that order."""
    envelope = json.loads(_cli(scene.nats_url, "queue", "--json"))
    rows = envelope["data"]["rows"]
    leader = [r["workload_id"] for r in rows]
    factor = {r["allocation"]: r["fairshare"] for r in rows if r["allocation"]}
    served: list[str] = []  # allocations in the order the leader serves them
    tier: dict[str, str] = {}
    for r in rows:
        name = r["allocation"] or "~"
        if name not in served:
            served.append(name)
            tier[name] = r["tier"]
    allocated = [a for a in served if a != "~"]
    # The leader's order itself follows the stated rule: tiers in order, and within one,
    # the higher factor first; two allocations in one tier with different factors make
    # the comparison bite.
    keys = [(TIERS.index(tier[a]), -factor[a]) for a in allocated]
    assert keys == sorted(keys), list(zip(allocated, keys, strict=True))
    assert any(
        tier[a] == tier[b] and factor[a] > factor[b] for a, b in itertools.pairwise(allocated)
    ), (allocated, factor)

    # The queue page: the allocations in served order, with the words.
    page = open_page(scene.url + "/queue").page
    assert _page_order(page) == leader
    shown = page.eval_on_selector_all(
        "#served-order [data-served-allocation]", "xs => xs.map(x => x.dataset.servedAllocation)"
    )
    assert shown == served
    said = page.locator("#priority-now").inner_text()
    assert "position order, 1 = served first" in said, said
    assert "fairshare factor (1 = served first" in said, said
    for a in allocated:
        assert f"{a} ({tier[a]}, factor {factor[a]:.3f})" in said, (a, said)
    header = page.locator("#queue thead").inner_text().lower()
    assert "position" in header and "fairshare factor" in header and "rank" not in header

    # The fair share page: the same factors, and the same direction.
    page = open_page(scene.url + "/").page
    note = page.locator("#fairshare-order").inner_text()
    assert "1 = served first" in note and "rank 1" not in note, note
    for a in allocated:
        cell = page.locator(f'tr[data-allocation="{a}"] td[data-fairshare]')
        assert float(cell.get_attribute("data-fairshare") or "nan") == pytest.approx(factor[a])
    assert "rank" not in page.locator("#tree thead").inner_text().lower()

    # allot queue and allot prio: the leader's order, its factors, the legend.
    for args in (("queue",), ("queue", "-l"), ("prio",)):
        text = _cli(scene.nats_url, *args)
        table = _table(text, "POS", len(leader))
        assert [r["WORKLOAD"] for r in table] == leader, args
        assert [r["POS"] for r in table] == [str(i) for i in range(1, len(leader) + 1)]
        for r in table:
            if r["ALLOC"] != "~":
                assert r["FAIRSHARE"] == f"{factor[r['ALLOC']]:.3f}", (args, r)
        assert "Served in POS order (1 = served first)" in text, text
        assert "FAIRSHARE factor (1 = served first)" in text, text

    # allot share: the factors; allot share -l: Slurm's rank, whose legend says the highest
    # is served first, and whose numbers agree.
    share = {
        r["Account"].rsplit("/", 1)[1]: r
        for r in _table(_cli(scene.nats_url, "share"), "Account", NODES)
    }
    for a in allocated:
        assert float(share[a]["FairShare"]) == pytest.approx(factor[a]), share[a]
    text = _cli(scene.nats_url, "share", "-l")
    assert "FairShare: the allocation's fairshare factor, 1 = served first" in text, text
    assert "Rank: Slurm's Fair Tree rank, 5 (the number of allocations) = served first" in text
    rank = {
        r["Account"].rsplit("/", 1)[1]: int(r["Rank"])
        for r in _table(text, "Account", NODES)
        if r["Rank"] != "-"
    }
    keys = [(TIERS.index(tier[a]), -rank[a]) for a in allocated]
    assert keys == sorted(keys), list(zip(allocated, keys, strict=True))


def _page_order(page: Page) -> list[str]:
    return page.eval_on_selector_all(
        "#queue tr[data-workload-id]", "rows => rows.map(r => r.dataset.workloadId)"
    )


def test_queue_page_order_equals_allot_queue_json(
    scene: Scene, open_page: Callable[[str], Opened], screenshot: Callable[[Page, str], Path]
) -> None:
    page = open_page(scene.url + "/queue").page
    cli = _cli_queue(scene.nats_url)
    shown = _page_order(page)
    assert len(cli) == 6 and set(cli) == {scene.victim, *scene.waiting}, cli
    assert shown == cli
    positions = page.eval_on_selector_all(
        "#queue tr[data-workload-id]", "rows => rows.map(r => Number(r.dataset.position))"
    )
    assert positions == list(range(1, len(cli) + 1))
    _wait_refreshed(page, 2)  # a refreshed table keeps the order
    assert _page_order(page) == _cli_queue(scene.nats_url)
    assert "What priority means now" in page.inner_text("#live")
    assert page.locator("#priority-now").inner_text().count("pending") >= 1
    header = page.locator("#queue thead").inner_text()
    for column in ("position", "tier", "fairshare factor", "priority", "age", "reason", "estimate"):
        assert column in header, header
    screenshot(page, "queue-order")


def test_preemption_appears_on_the_workload_page_with_its_reason(
    scene: Scene, open_page: Callable[[str], Opened], screenshot: Callable[[Page, str], Path]
) -> None:
    page = open_page(f"{scene.url}/workload/{scene.victim}").page
    kinds = page.eval_on_selector_all(
        "#timeline li", "items => items.map(i => i.dataset.eventKind)"
    )
    for kind in ("submitted", "placed", "protected-until", "notice", "preempted", "requeued"):
        assert kind in kinds, kinds
    assert kinds.index("notice") < kinds.index("preempted") < kinds.index("requeued")
    notice = page.locator('#timeline li[data-event-kind="notice"]')
    assert notice.count() == 1
    assert notice.get_attribute("data-reason") == "reclaimed-for-entitlement"
    assert notice.get_attribute("data-preemptor") == scene.preemptor
    text = notice.inner_text()
    assert "reclaimed for an allocation below its entitlement" in text, text
    assert scene.preemptor in text, text
    # The victim has left: the notice says so, not "must leave by" a deadline now past.
    assert "left (preempted)" in text and "before its deadline" in text, text
    assert "must leave" not in text, text
    assert "fairshare factor" in text and "rank" not in text, text
    assert page.locator("#state").get_attribute("data-state") == "pending"
    screenshot(page, "workload-preempted")
    notice.locator(f'a[href="/workload/{scene.preemptor}"]').click()
    page.wait_for_url(f"**/workload/{scene.preemptor}")
    assert page.locator("#state").get_attribute("data-state") == "running"


def test_open_pages_follow_the_stack_live(
    scene: Scene, open_page: Callable[[str], Opened], screenshot: Callable[[Page, str], Path]
) -> None:
    queue = open_page(scene.url + "/queue").page
    hosts = open_page(scene.url + "/hosts").page
    host = hosts.locator("tr[data-host]").first.get_attribute("data-host")
    assert host is not None

    async def act() -> tuple[str, float]:
        async with Client(scene.nats_url) as c:
            late = await c.submit(
                client_id="late", user="eve", allocation="speech", gpus=2, min_runtime_s=60
            )
            await c.drain(host, operator="ops", reason="browser test")
            on_host = [
                s
                for s in [await c.status(w) for w in scene.running]
                if any(a.host == host for a in s.assignment)
            ]
            assert on_host, f"nothing runs on {host}"
            return late.workload_id, max(s.protected_until or 0.0 for s in on_host)

    late, deadline = run_async(act())
    # No reload: the pages' own polling brings the change in.
    queue.wait_for_selector(f'#queue tr[data-workload-id="{late}"]', timeout=15_000)
    row = hosts.wait_for_selector(f'tr[data-host="{host}"][data-state="draining"]', timeout=15_000)
    assert row is not None
    shown = float(row.get_attribute("data-deadline") or "nan")
    assert abs(shown - deadline) < 0.01, (shown, deadline)
    assert hosts.locator(f'#drains li[data-drain-host="{host}"]').count() == 1
    screenshot(hosts, "hosts-draining")
