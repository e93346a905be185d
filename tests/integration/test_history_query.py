"""The log's history for operators and managers under logins (``allot up --secure``):
``allot.v1.query.history``, answered by the ranking service with the services' credentials
(decisions 0054 and 0080).

The operator's and the manager's own logins (no JetStream API) run ``allot budgets
history`` and ``allot export --since``; a team's login is refused by NATS; a bad page size
is refused naming ``limit`` (idle records of a stream but USAGE: ``idle``); pages are
bounded and chain to the end; a submission's ``command`` and ``env`` never leave the
service; a request whose reply subject is no inbox (here a HOSTS stream subject the
operator may read) is never answered.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import msgspec
import pytest
from live_harness import allot, eventually, quick_stack, seed

from allot import bus
from allot.bus import history_pages
from allot.cli.live_cmds import EXIT_REFUSED
from allot.ops.stack import AgentSpec, Stack
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import Client

pytestmark = pytest.mark.integration

SECRET = "hunter2-token-in-env"
_REPLY = msgspec.json.Decoder(m.HistoryPage | m.CommandRejected)


async def test_operators_and_managers_read_the_history_through_the_ranking_service(
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = quick_stack(
        tmp_path / "run",
        redis_url,
        "hist",
        secure=True,
        agents=(AgentSpec("fk", hosts=2, gpus=4),),
        placements=1,
    )
    with Stack(config) as stack:
        assert stack.auth is not None and stack.ca_file is not None
        monkeypatch.setenv("ALLOT_NATS_CA", str(stack.ca_file))
        await asyncio.sleep(2.0)  # the log starts (hosts, tree) well before the window
        began = time.time()
        ids = []
        async with Client(stack.url_for("nlp"), timeout=5.0, retries=0) as team:
            for i in range(3):
                reply = await team.submit(
                    client_id=f"h{i}",
                    allocation="nlp",
                    gpus=1,
                    duration_s=2.0,
                    command=("train.py", f"--token={SECRET}"),
                    env={"API_TOKEN": SECRET},
                )
                ids.append(reply.workload_id)

            async def done() -> int:
                return sum([(await team.status(w, scope="nlp")).state == "completed" for w in ids])

            await eventually(done, lambda n: n == len(ids), timeout=60)
        since = f"{int(time.time() - began) + 1}s"

        # The manager changes a share, with its own login; both read the history.
        admin, ops = stack.url_for("admin"), stack.url_for("ops")
        code, _, err = await allot(
            capsys, "budgets", "set", "root/research/nlp", "60", "--nats-url", admin
        )
        assert code == 0, err
        for url in (ops, admin):
            code, out, err = await allot(capsys, "budgets", "history", "--json", "--nats-url", url)
            assert code == 0, err
            changes = json.loads(out)["data"]["changes"]
            assert [c["by"] for c in changes] == ["bootstrap", "admin"]
            assert changes[1]["changes"] == [{"path": "root/research/nlp", "old": 50, "new": 60}]
            folder = tmp_path / f"export-{url.split(':')[1].strip('/')}"
            code, out, err = await allot(
                capsys, "export", "--since", since, "--out", str(folder), "--nats-url", url
            )
            assert code == 0, err
            exported = json.loads((folder / "export.json").read_text())
            assert exported["workloads"] == len(ids) and exported["hosts"] == 2
            assert SECRET not in (folder / "trace.csv").read_text()

        # A team's login may not ask: NATS refuses the subject, no fallback.
        code, _, err = await allot(capsys, "budgets", "history", "--nats-url", stack.url_for("nlp"))
        assert code == EXIT_REFUSED, err
        assert s.QUERY_HISTORY in err

        async with Client(ops, timeout=5.0, retries=0) as c:
            nc = c.nc

            async def ask(body: dict[str, object]) -> m.HistoryPage | m.CommandRejected:
                msg = await nc.request(s.QUERY_HISTORY, json.dumps(body).encode(), timeout=5)
                return _REPLY.decode(msg.data)

            # Bad input: refused naming the field.
            bad: tuple[tuple[dict[str, object], str], ...] = (
                ({"type": "HistoryQuery", "stream": "WORKLOADS", "limit": 0}, "limit"),
                ({"type": "HistoryQuery", "stream": "WORKLOADS", "limit": 100_000}, "limit"),
                ({"type": "HistoryQuery", "stream": "SECRETS"}, "stream"),
                (
                    {"type": "HistoryQuery", "stream": "HOSTS", "start_seq": 1, "start_time": 1},
                    "start_time",
                ),
                ({"type": "HistoryQuery", "stream": "HOSTS", "idle": True}, "idle"),
            )
            for body, field in bad:
                refused = await ask(body)
                assert isinstance(refused, m.CommandRejected), body
                assert refused.field == field, refused

            # Pages of 2 chain to the end; no submission carries its command or env.
            seen: list[m.HistoryRecord] = []
            start = 1
            while True:
                page = await ask(
                    {"type": "HistoryQuery", "stream": "WORKLOADS", "start_seq": start, "limit": 2}
                )
                assert isinstance(page, m.HistoryPage), page
                assert len(page.records) <= 2
                seen += page.records
                if page.end:
                    break
                assert page.next_seq > start
                start = page.next_seq
            seqs = [r.seq for r in seen]
            assert seqs == sorted(set(seqs)) and seqs[-1] == page.last_seq
            submitted = [r for r in seen if r.subject.endswith(".submitted")]
            assert len(submitted) == len(ids)
            for r in seen:
                assert SECRET.encode() not in bytes(r.record)
            for r in submitted:
                record = msgspec.json.decode(bytes(r.record))
                assert record.get("command", []) == [] and record.get("env", {}) == {}

            # A reply subject that is no inbox is never answered: here a HOSTS subject the
            # operator may read (answering would also write a record into HOSTS).
            trap = f"{s.PREFIX}.host.trap.state"
            caught: list[bytes] = []

            async def on_trap(msg: object) -> None:
                caught.append(getattr(msg, "data", b""))

            sub = await nc.subscribe(trap, cb=on_trap)
            await nc.flush()
            raw = json.dumps({"type": "HistoryQuery", "stream": "HOSTS", "limit": 1}).encode()
            await nc.publish(s.QUERY_HISTORY, raw, reply=trap)
            await nc.flush()
            # The same request with an inbox is answered: the service is up and reads HOSTS.
            assert isinstance(await ask({"type": "HistoryQuery", "stream": "HOSTS"}), m.HistoryPage)
            await asyncio.sleep(1.0)
            await sub.unsubscribe()
            assert caught == []


async def test_a_page_by_start_time_that_read_nothing_points_at_its_first_record(
    fresh_log: str,
) -> None:
    """A page asked from ``start_time`` whose read ended before any record came (its wait
    ran out) must not point past the records it skipped: its ``next_seq`` is the first
    record stored at or after that time, so the next page reads them."""
    nc, js = await bus.connect(fresh_log, "test-history")
    try:
        await seed(js, {"h1": 8, "h2": 8})
        await asyncio.sleep(0.2)  # the earlier records stored well before ``since``
        since = time.time()
        for host in ("h3", "h4"):
            await bus.publish(
                js, s.host_state(host), m.HostRegistered(host=host, gpus=8, at=time.time())
            )
        query = m.HistoryQuery(stream="HOSTS", start_time=since)
        empty = await history_pages.read_page(js, query, timeout=1e-6)
        assert empty.records == () and not empty.end
        assert empty.next_seq == 3  # h3's record, not past h4's
        page = await history_pages.read_page(js, query)
        assert [r.seq for r in page.records] == [3, 4] and page.end
    finally:
        await nc.close()
