"""``allot up --nats-cluster 3``: the stack on three clustered NATS nodes, each node
SIGKILLed in turn while work runs, and nothing is lost.

One ``allot up`` process (as a user runs it: its own NATS nodes and Redis, on free ports,
never 4222), one fake host of 8 GPUs. First the path of ``test_end_to_end``: a protected
run, preempted for an allocation owed GPUs once its protection ends, requeued, run again,
completed; the node leading the WORKLOADS stream (the log of record) is SIGKILLed while
the run holds its GPUs, so a new stream leader is elected meanwhile (nats-server's raft
election timeout, 4-9 s). ``allot up`` restarts the node; once every replica is current
again, the next node is killed under a burst of submissions, then the third. At the end
every accepted submission is in the log once and completed, and the GPU-seconds charged
in Redis (two accounting instances sharing the durable consumer) equal those the log says
ran: nothing lost, nothing charged twice.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from live_harness import (
    assert_preempted_and_requeued,
    charged_as_ran,
    eventually,
    of_type,
    records,
    start_allot,
)
from nats.js import JetStreamContext
from test_end_to_end import _js
from test_up_supervision import Up

from allot.bus import server_urls
from allot.cli.main import main
from allot.ops.stack import Stack, StackConfig
from allot.proto import messages as m
from allot.sdk import Client
from allot.sdk.errors import SdkError

pytestmark = pytest.mark.integration

NODES = ("nats-1", "nats-2", "nats-3")
STREAMS = ("WORKLOADS", "HOSTS", "USAGE", "KV_allot_leader")
TERMINAL = m.WorkloadPreempted | m.WorkloadCompleted | m.WorkloadFailed


@asynccontextmanager
async def allot_up_cluster(run_dir: Path) -> AsyncIterator[Up]:
    """``allot up --nats-cluster 3`` with one fake host, ready (its banner read)."""
    argv = ["up", "--nats-cluster", "3", "--run-dir", str(run_dir)]
    argv += ["--agents", "1", "--hosts", "1", "--gpus", "8", "--grace-s", "3"]
    argv += ["--rank-every-s", "1", "--unallocated-settle-s", "0.5"]
    argv += ["--restart-backoff-s", "0.2"]
    proc = await start_allot(argv, own_group=True)  # the stack, whatever happens here
    up = Up(proc, run_dir)
    try:
        await up.ready()
        yield up
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)  # its stack stops with it
            try:
                await asyncio.wait_for(proc.communicate(), 60)
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


def _exported(up: Up, name: str) -> str:
    found = re.search(rf"export {name}=(\S+)", up.seen)
    assert found, up.seen
    return found.group(1)


def _node(server_name: str) -> str:
    """The stack's name of a node (``nats-2``) from its server name (``allot-n2``)."""
    return f"nats-{server_name.rsplit('-n', 1)[1]}"


async def _current(js: JetStreamContext) -> bool:
    """Every stream, and accounting's durable consumer, has a leader and two current,
    online replicas: losing any one node now leaves a quorum everywhere."""
    try:
        groups = [(await js.stream_info(s)).cluster for s in STREAMS]
        groups.append((await js.consumer_info("WORKLOADS", "accounting")).cluster)
    except Exception:  # no leader for a moment: not current
        return False
    return all(
        g is not None
        and g.leader
        and len(g.replicas or []) == 2
        and all(r.current and not r.offline for r in g.replicas or [])
        for g in groups
    )


async def _kill(up: Up, node: str) -> None:
    """SIGKILL ``node`` and wait until ``allot up`` has restarted it."""
    os.kill(up.pids[node], signal.SIGKILL)
    restarted = await up.until(rf"restarted {node}: pid (\d+)", timeout=30)
    assert f"{node} exited with -9 (SIGKILL); restarting it" in up.seen
    up.pids[node] = int(restarted.group(1))


async def _submit(c: Client, client_id: str, **kw: object) -> str:
    """Submit until acknowledged (the same ``client_id``: never queued twice), as a client
    that sees timeouts while a stream leader is elected does."""
    deadline = time.monotonic() + 40
    while True:
        try:
            return (await c.submit(client_id=client_id, **kw)).workload_id  # type: ignore[arg-type]
        except SdkError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _status(c: Client, wid: str) -> m.WorkloadStatus | None:
    try:
        return await c.status(wid)
    except SdkError:  # no leader for a moment (placement or a stream), or a timeout
        return None


async def _burst(c: Client, start: int, n: int) -> list[str]:
    """``n`` short runs, allocated and not, of 1 to 4 GPUs."""
    out = []
    for i in range(start, start + n):
        alloc = ("nlp", "vision", "search", None)[i % 4]
        out.append(
            await _submit(
                c,
                f"load-{i}",
                user="u",
                allocation=alloc,
                gpus=(1, 2, 4, 1)[i % 4],
                min_runtime_s=1 if alloc else 0,
                duration_s=0.5 + (i % 3) * 0.3,
            )
        )
    return out


async def test_each_node_killed_in_turn_loses_nothing_and_charges_once(tmp_path: Path) -> None:
    async with allot_up_cluster(tmp_path / "run") as up:
        assert all(node in up.pids for node in NODES), up.seen
        assert "accounting-1" in up.pids and "accounting-2" in up.pids, up.seen
        assert "placement-1" in up.pids and "placement-2" in up.pids, up.seen
        url = _exported(up, "ALLOT_NATS_URL")
        urls = server_urls(url)
        assert len(urls) == 3 and not any(u.endswith(":4222") for u in urls), urls
        redis_url = _exported(up, "ALLOT_REDIS_URL")
        async with Client(url, timeout=3.0, retries=2) as c:
            js = _js(c)
            for stream in STREAMS:  # every stream and the lease bucket: one copy per node
                assert (await js.stream_info(stream)).config.num_replicas == 3, stream
            accepted = await _end_to_end_with_the_log_leader_killed(up, c, urls)
            # The two other nodes, each in turn under a burst of submissions, once every
            # replica is current again (else a second loss could leave no quorum).
            killed = [n for n in NODES if f"restarted {n}:" in up.seen]
            for i, node in enumerate(n for n in NODES if n not in killed):
                await eventually(lambda: _current(js), bool, timeout=30)
                accepted += await _burst(c, 10 * i, 5)
                print(f"killing {node}; WORKLOADS led by {await _stream_leader(js)}")
                await _kill(up, node)
                accepted += await _burst(c, 10 * i + 5, 5)
            assert all(f"restarted {n}:" in up.seen for n in NODES), up.seen

            async def states() -> list[str | None]:
                return [getattr(await _status(c, w), "state", None) for w in accepted]

            await eventually(states, lambda ss: set(ss) == {"completed"}, timeout=60)
            await eventually(lambda: _current(js), bool, timeout=30)
            log = await records(js)
            await charged_as_ran(log, redis_url, "allot")  # allot up's prefix
        assert up.proc.returncode is None, up.seen  # the stack kept running all along
    # Nothing lost, nothing twice: every accepted submission is in the log once.
    submitted = [r.workload_id for r in of_type(log, m.WorkloadSubmitted)]
    assert sorted(submitted) == sorted(accepted) and len(set(submitted)) == len(accepted)
    completed = {r.workload_id for r in of_type(log, m.WorkloadCompleted)}
    assert completed == set(accepted)


async def _end_to_end_with_the_log_leader_killed(up: Up, c: Client, urls: list[str]) -> list[str]:
    """``test_end_to_end``'s path on a fake host: a protected run, a notice once its
    protection has ended, preempted, requeued, run again, completed. The node leading the
    WORKLOADS stream is SIGKILLed while the run holds its GPUs; the requester arrives once
    a new leader is elected (the run, 16 s, outlasts an election's 4-9 s).

    A short nlp run first: ``allot up`` charges running work every 30 s, so without usage
    of its own before, nlp would tie with ads when the victim is requeued, and the victim,
    older, would be placed first again (the README's known limit) and, a fake part as long
    as its first attempt, noticed again."""
    leader = await _stream_leader(_js(c))
    assert leader is not None
    # Notices are core NATS, live only: the subscriber is kept off the node to be killed
    # (a subscription is away while its client reconnects, and a notice then missed).
    others = [u for i, u in enumerate(urls) if NODES[i] != leader]
    warm = await _submit(
        c, "warm-1", user="ann", allocation="nlp", gpus=1, min_runtime_s=1, duration_s=1
    )
    await eventually(lambda: _fairshare(c), lambda f: f["ads"] > f["nlp"], timeout=30)
    async with Client(",".join(others)) as watcher:
        notices: list[m.PreemptionNotice] = []
        sub = await watcher.on_preemption(notices.append, allocation="nlp")
        victim = await _submit(
            c, "victim", user="ann", allocation="nlp", gpus=8, min_runtime_s=3, duration_s=16
        )
        await eventually(
            lambda: _status(c, victim),
            lambda st: st is not None and st.run_started_at is not None,
            timeout=30,
        )
        killed_at = time.monotonic()
        await _kill(up, leader)
        # Answered by the stream's leader: once there is one again (the restarted node
        # may win the election too).
        elected = await eventually(lambda: _stream_leader(_js(c)), bool, timeout=20)
        took = time.monotonic() - killed_at
        print(f"killed {leader}, the WORKLOADS leader: {elected} leads after {took:.1f} s")
        # ads holds nothing and is owed GPUs.
        ads = await _submit(
            c, "ads-1", user="bo", allocation="ads", gpus=2, min_runtime_s=60, duration_s=2
        )
        notice = (await eventually(lambda: asyncio.sleep(0, notices), bool, timeout=20))[0]
        assert notice.workload_id == victim
        assert notice.reason == "reclaimed-for-entitlement"
        assert notice.preemptor == ads
        assert notice.preemptor_allocation == "ads"
        for wid in (victim, ads):
            await eventually(
                lambda w=wid: _status(c, w),  # type: ignore[misc]
                lambda st: st is not None and st.state == "completed",
                timeout=40,
            )
        await sub.unsubscribe()
    final = await _status(c, victim)
    assert final is not None and final.attempt == 2
    log = await records(_js(c))
    placed = next(r for r in of_type(log, m.WorkloadPlaced) if r.workload_id == victim)
    assert notice.at >= placed.at + 3 - 0.05  # protection honoured
    assert_preempted_and_requeued(log, victim)
    return [warm, victim, ads]


async def _fairshare(c: Client) -> dict[str, float]:
    """Each allocation's fairshare factor (1 = served first), as last ranked."""
    try:
        return {r.name: r.fairshare or 0.0 for r in (await c.share()).nodes if r.leaf}
    except SdkError:
        return {"nlp": 0.0, "ads": 0.0}


async def _stream_leader(js: JetStreamContext, stream: str = "WORKLOADS") -> str | None:
    """The node leading ``stream`` (``nats-2``), None while it has no leader."""
    try:
        info = await js.stream_info(stream)
    except Exception:  # no leader to answer for a moment
        return None
    return _node(info.cluster.leader) if info.cluster and info.cluster.leader else None


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--nats-cluster", "2"], "must be 1, 3 or 5, got 2: an odd number of nodes"),
        (["--nats-cluster", "4"], "must be 1, 3 or 5, got 4"),
        (["--nats-cluster", "0"], "must be 1, 3 or 5, got 0"),
        (["--nats-cluster", "7"], "must be 1, 3 or 5, got 7"),
        (["--nats-cluster", "3", "--nats-url", "nats://127.0.0.1:1"], "do not give --nats-url"),
        (["--nats-cluster", "3", "--secure"], "does not run with --secure yet"),
    ],
)
def test_a_bad_cluster_is_refused_naming_the_option(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["up", *flags, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("allot up: --nats-cluster: "), err
    assert says in err[0], err


def test_a_run_dir_of_another_cluster_size_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Three nodes' stores are not five nodes' (their raft groups know three peers)."""
    for i in (1, 2, 3):
        (tmp_path / "nats-cluster" / f"n{i}" / "store").mkdir(parents=True)
    assert main(["up", "--nats-cluster", "5", "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("allot up: --nats-cluster: ") and "a 3-node cluster" in err, err


class Nodes:
    """What ``Stack.supervise`` reads of an ``EmbeddedNatsCluster``: three nodes, alive."""

    n = 3

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.codes: list[int | None] = [None] * 3
        self.pids = [100, 200, 300]

    def running(self, i: int) -> bool:
        return self.codes[i] is None

    def exit_status(self, i: int) -> int | None:
        return self.codes[i]

    def restart(self, i: int, wait: bool = True) -> None:
        self.codes[i] = None
        self.pids[i] += 1

    def pid(self, i: int) -> int:
        return self.pids[i]

    def log_path(self, i: int) -> Path:
        return self.logs / f"n{i + 1}.log"


def test_a_node_that_exits_is_restarted_within_the_budget_then_stops_the_stack(
    tmp_path: Path,
) -> None:
    """As a service (``tests/unit/test_stack_supervise.py``), named ``nats-<i>``, its own
    log quoted when it has used its budget."""
    config = StackConfig(
        run_dir=tmp_path, nats_nodes=3, dashboard=False, restart_limit=1, restart_backoff_s=0.5
    )
    stack = Stack(config)  # not started: no servers, no processes
    nodes = Nodes(tmp_path)
    (tmp_path / "n2.log").write_text("[ERR] a last line\n")
    stack.cluster = nodes  # type: ignore[assignment]
    said: list[str] = []
    assert stack.supervise(said.append, now=0.0) is None
    nodes.codes[1] = -9
    assert stack.supervise(said.append, now=1.0) is None
    assert said == [
        "nats-2 exited with -9 (SIGKILL); restarting it in 0.5 s (restart 1 of 1 within 60 s)"
    ]
    assert stack.supervise(said.append, now=1.4) is None and not nodes.running(1)
    assert stack.supervise(said.append, now=1.5) is None and nodes.running(1)
    assert said[-1] == "restarted nats-2: pid 201" and stack.restarts == {"nats-2": 1}
    nodes.codes[1] = 1
    stop = stack.supervise(said.append, now=2.0)
    assert stop == (
        f"NATS node nats-2 exited with 1 after 1 restart within 60 s; the end of "
        f"{tmp_path / 'n2.log'}:\n  [ERR] a last line"
    )
