"""``allot whatif``, ``allot export`` and ``allot budgets history`` on a live history: the
whole stack as processes runs a contended mix of two allocations and unallocated filler;
then, read back from the log through NATS,

1. ``whatif --set root/nlp=4`` (from 1:1) replays the history, cut while both queues are
   still full, under both trees: nlp's simulated delivered GPU-hours rise, vision's fall;
   the page and the JSON are written;
2. ``export`` writes the window as the simulator's files and ``simulate`` replays them;
3. two ``budgets set`` later, ``budgets history`` lists both, in order, with author and time;
4. a ``--since`` longer than the log is refused naming the option.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest
from live_harness import allot, eventually, quick_stack

from allot.ops.stack import AgentSpec, Stack
from allot.sdk import Client

pytestmark = pytest.mark.integration

BUDGETS = """\
name: root
children:
  - {name: nlp, shares: 1}
  - {name: vision, shares: 1}
"""
# The live stack's knobs, given to the replays too (the log does not record them).
ENGINE = [
    "--grace",
    "2",
    "--unallocated-grace",
    "2",
    "--unallocated-settle",
    "1",
    "--rank-every",
    "1",
]


async def test_whatif_export_and_budget_history_on_a_live_history(
    fresh_log: str, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(BUDGETS)
    config = quick_stack(
        tmp_path / "run",
        redis_url,
        "whatif",
        nats_url=fresh_log,
        budgets=budgets,
        agents=(AgentSpec("gpu", hosts=2, gpus=8),),
        placements=1,
        unallocated_grace_s=2,
        unallocated_settle_s=1.0,
        lease_ttl_s=1.0,
        accrue_s=1.0,
        slot_s=1.0,
        dashboard=False,
    )
    url = ["--nats-url", fresh_log]
    with Stack(config):
        await asyncio.sleep(1.5)  # the log starts (hosts, tree) well before the window
        began = time.time()
        async with Client(fresh_log) as c:
            ids = []
            # Each allocation asks for the whole cluster one and a half times over (12 x 4
            # GPUs x 10 s on 16): queues are still full when the window ends.
            for i in range(12):
                for alloc in ("nlp", "vision"):
                    reply = await c.submit(
                        client_id=f"{alloc}-{i}",
                        user=alloc,
                        allocation=alloc,
                        gpus=4,
                        min_runtime_s=2,
                        duration_s=10.0,
                    )
                    ids.append(reply.workload_id)
            for i in range(2):  # unallocated filler
                reply = await c.submit(client_id=f"free-{i}", user="batch", gpus=8, duration_s=10.0)
                ids.append(reply.workload_id)

            async def completed() -> int:
                return sum([(await c.status(w)).state == "completed" for w in ids])

            # Two rounds done, more than half of the work still to do.
            await eventually(completed, lambda n: n >= 8, timeout=60)
        since = f"{math.ceil(time.time() - began) + 1}s"

        # 1. whatif: nlp from 1 share to 4
        out_dir = tmp_path / "whatif"
        code, out, err = await allot(
            capsys,
            "whatif",
            "--since",
            since,
            "--set",
            "root/nlp=4",
            "--out",
            str(out_dir),
            *ENGINE,
            *url,
        )
        assert code == 0, err
        assert "proposed: root/nlp 1 -> 4" in out
        assert "nlp" in out and "vision" in out and "->" in out
        assert (out_dir / "report.html").is_file()
        report = json.loads((out_dir / "report.json").read_text())
        assert report["window"]["workloads"] == len(ids)
        nlp, vision = report["by_allocation"]["nlp"], report["by_allocation"]["vision"]
        assert nlp["proposed"]["delivered_gpu_h"] > nlp["current"]["delivered_gpu_h"]
        assert vision["proposed"]["delivered_gpu_h"] < vision["current"]["delivered_gpu_h"]
        for side in ("current", "proposed"):
            assert json.loads((out_dir / side / "report.json").read_text())["workloads"] == len(ids)

        # 2. export, then simulate the folder
        folder = tmp_path / "export"
        code, out, err = await allot(capsys, "export", "--since", since, "--out", str(folder), *url)
        assert code == 0, err
        exported = json.loads((folder / "export.json").read_text())
        assert exported["workloads"] == len(ids) and exported["hosts"] == 2
        trace = (folder / "trace.csv").read_text().splitlines()
        assert len(trace) == 1 + len(ids)
        assert "gpu-0000" in (folder / "cluster.yaml").read_text()
        sim = tmp_path / "sim"
        code, out, err = await allot(
            capsys,
            "simulate",
            "--cluster",
            str(folder / "cluster.yaml"),
            "--budgets",
            str(folder / "budgets.yaml"),
            "--trace",
            str(folder / "trace.csv"),
            "--out",
            str(sim),
            "--quiet",
            *ENGINE,
        )
        assert code == 0, err
        simulated = json.loads((sim / "report.json").read_text())
        # The work not ended in the window carries its declared duration: all of it ends.
        assert (simulated["workloads"], simulated["completed"]) == (len(ids), len(ids))

        # 3. two budget changes, then the history
        for path, shares, by in (("root/nlp", "3", "alice"), ("root/vision", "2", "bob")):
            code, _, err = await allot(capsys, "budgets", "set", path, shares, "--by", by, *url)
            assert code == 0, err
        code, out, err = await allot(capsys, "budgets", "history", "--json", *url)
        assert code == 0, err
        changes = json.loads(out)["data"]["changes"]
        assert [c["by"] for c in changes] == ["bootstrap", "alice", "bob"]
        assert [c["changes"] for c in changes[1:]] == [
            [{"path": "root/nlp", "old": 1, "new": 3}],
            [{"path": "root/vision", "old": 1, "new": 2}],
        ]
        times = [c["at"] for c in changes]
        assert times == sorted(times) and times[1] >= began
        code, out, _ = await allot(capsys, "budgets", "history", *url)
        lines = out.splitlines()
        assert code == 0 and len(lines) == 3
        assert lines[1].split()[1:] == ["alice", "root/nlp", "1", "->", "3"]
        assert lines[2].split()[1:] == ["bob", "root/vision", "1", "->", "2"]

        # 4. a window longer than the log
        code, _, err = await allot(capsys, "whatif", "--since", "30d", "--set", "nlp=2", *url)
        assert code == 2
        assert "allot whatif: --since: 30d: the window starts" in err
