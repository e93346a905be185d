"""`allot hosts` at fleet size: the placement leader answers one page of hosts that fits in
one NATS message, in id order after the query's ``after``, with the count of all hosts;
asking page after page returns every host once. 10,000 hosts' rows are more than NATS's
1 MiB: as one answer, the reply could not be sent and `allot hosts` timed out."""

from __future__ import annotations

import msgspec

from allot.eventlog.logfold import LogFold
from allot.proto import messages as m
from allot.services.dashboard.pages import hosts_page as dashboard_hosts
from allot.services.placement.answers import hosts_page

MIB = 1024 * 1024


def fleet(n: int) -> LogFold:
    f = LogFold()
    for i in reversed(range(n)):  # registered in the reverse of id order
        assert f.apply(m.HostRegistered(host=f"gpu-{i:05d}", gpus=8, at=1.0 + i)).changed
    return f


def read_all(f: LogFold, limit: int) -> tuple[list[str], list[int]]:
    """Every page as a client reads them: host ids in order, and each page's size."""
    hosts: list[str] = []
    sizes: list[int] = []
    after: str | None = None
    while True:
        data = hosts_page(f, m.HostsQuery(after=after), 5.0, limit)
        sizes.append(len(data))
        page = msgspec.json.decode(data, type=m.HostsSnapshot)
        assert page.total == len(f.state.host_ids)
        if not page.hosts:
            return hosts, sizes
        hosts += [row.host for row in page.hosts]
        after = hosts[-1]


def test_ten_thousand_hosts_come_in_pages_of_at_most_one_message() -> None:
    f = fleet(10_000)
    hosts, sizes = read_all(f, MIB)
    assert hosts == [f"gpu-{i:05d}" for i in range(10_000)]
    assert max(sizes) <= MIB and len(sizes) > 2  # more than one page, each within 1 MiB


def test_a_page_starts_after_the_host_it_names_and_a_small_limit_still_makes_progress() -> None:
    f = fleet(50)
    page = msgspec.json.decode(
        hosts_page(f, m.HostsQuery(after="gpu-00047"), 5.0, MIB), type=m.HostsSnapshot
    )
    assert [r.host for r in page.hosts] == ["gpu-00048", "gpu-00049"]
    assert page.total == 50
    # An id between two hosts pages from the next one; past the last, an empty page.
    page = msgspec.json.decode(
        hosts_page(f, m.HostsQuery(after="gpu-00010x"), 5.0, MIB), type=m.HostsSnapshot
    )
    assert page.hosts[0].host == "gpu-00011"
    last = hosts_page(f, m.HostsQuery(after="zz"), 5.0, MIB)
    assert msgspec.json.decode(last, type=m.HostsSnapshot).hosts == ()
    hosts, sizes = read_all(f, 600)  # a few rows a page
    assert hosts == [f"gpu-{i:05d}" for i in range(50)] and len(sizes) > 10


def test_a_page_says_which_hosts_are_the_short_lane() -> None:
    f = LogFold(short_lane=("gpu-00001",))
    for i in range(3):
        f.apply(m.HostRegistered(host=f"gpu-{i:05d}", gpus=8, at=1.0))
    page = msgspec.json.decode(hosts_page(f, m.HostsQuery(), 5.0, MIB), type=m.HostsSnapshot)
    assert [h.short_lane for h in page.hosts] == [False, True, False]
    view = dashboard_hosts(6.0, page, {})
    assert view.html.count('data-lane="short"') == 1
    assert '<tr data-host="gpu-00001" data-state="healthy" data-lane="short">' in view.html
