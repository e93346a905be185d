"""The wire contract without the SDK: a Node.js client (``tests/node``) gets its notice.

The whole live stack runs as processes (``allot.ops.stack``). A Node.js script, which
imports no Allot code and speaks plain JSON over NATS, checks that a malformed submission
is rejected naming ``gpus``, submits unallocated filler work that takes all 8 GPUs and
waits for its preemption notice. Python then submits allocated work that needs those GPUs;
the script must receive ``displaced-unallocated`` for its own workload.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from allot.ops.stack import AgentSpec, Stack, StackConfig

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
SCRIPT = NODE_DIR / "submit_and_wait_notice.mjs"
NOTICE_TIMEOUT_S = 20


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail(
            "node (Node.js >= 18) is not on PATH: this test proves the wire contract with a "
            "Node.js client; install Node.js (e.g. `apt-get install nodejs npm`)"
        )
    return node


def _install_node_deps() -> None:
    """A clean clone has no node_modules: install exactly what the lockfile pins."""
    if (NODE_DIR / "node_modules" / "nats" / "package.json").exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(f"npm is not on PATH; it is needed to install {NODE_DIR}/package-lock.json")
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"npm ci in {NODE_DIR} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def _tagged(lines: list[str], tag: str) -> dict[str, Any] | None:
    """The JSON of the script's first ``TAG {...}`` line, if it printed one."""
    for line in lines:
        if line.startswith(tag + " "):
            value = json.loads(line[len(tag) + 1 :])
            assert isinstance(value, dict)
            return value
    return None


class NodeClient:
    """The script as a child process, its stdout read line by line as it comes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.stderr = ""

    async def wait_for(self, tag: str, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while (found := _tagged(self.lines, tag)) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {tag} line within {timeout} s\n{self.output()}")
            try:
                raw = await asyncio.wait_for(self.proc.stdout.readline(), remaining)
            except TimeoutError:
                continue
            if not raw:  # the script ended without printing it
                await self.finish(5)
                raise AssertionError(f"the script exited without a {tag} line\n{self.output()}")
            self.lines.append(raw.decode().rstrip("\n"))
        return found

    async def finish(self, timeout: float) -> int:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        try:
            out, err = await asyncio.wait_for(self.proc.communicate(), timeout)
        except TimeoutError:
            self.proc.kill()
            out, err = await self.proc.communicate()
        self.lines += out.decode().splitlines()
        self.stderr += err.decode()
        assert self.proc.returncode is not None
        return self.proc.returncode

    def output(self) -> str:
        return (
            f"exit code: {self.proc.returncode}\n--- stdout\n"
            + "\n".join(self.lines)
            + f"\n--- stderr\n{self.stderr}"
        )


async def _wait_running(nc: NatsClient, workload_id: str, timeout: float) -> dict[str, Any]:
    """Poll the placement leader (plain JSON StatusQuery) until the workload is placed."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    query = json.dumps({"type": "StatusQuery", "workload_id": workload_id}).encode()
    while time.monotonic() < deadline:
        reply = await nc.request("allot.v1.query.status", query, timeout=2.0)
        status = json.loads(reply.data)
        if status.get("state") == "running":
            return status
        await asyncio.sleep(0.1)
    raise AssertionError(f"{workload_id} not running within {timeout} s; last status {status}")


def _log_tails(run_dir: Path) -> str:
    parts = []
    for log in sorted((run_dir / "logs").glob("*.log")):
        text = log.read_text(encoding="utf-8", errors="replace")
        parts.append(f"--- {log.name} (tail)\n{text[-1500:]}")
    return "\n".join(parts)


@pytest.mark.integration
async def test_node_client_receives_displaced_unallocated_notice(
    fresh_log: str, redis_url: str, tmp_path: Path
) -> None:
    node = _node()
    _install_node_deps()
    stack = Stack(
        StackConfig(
            run_dir=tmp_path,
            nats_url=fresh_log,
            redis_url=redis_url,
            agents=(AgentSpec("node", hosts=1, gpus=8),),
            placements=1,
            grace_s=2,
            rank_every_s=1.0,
            fake_duration_s=600,
            lease_ttl_s=1.0,
        )
    )
    # Stack.start runs its own event loop (asyncio.run): keep it off the test's loop.
    await asyncio.to_thread(stack.start, 30.0)
    client: NodeClient | None = None
    nc = await nats.connect(fresh_log)
    try:
        proc = await asyncio.create_subprocess_exec(
            node,
            str(SCRIPT),
            "--nats",
            fresh_log,
            "--client-id",
            f"node-{uuid.uuid4().hex[:12]}",
            "--gpus",
            "8",
            "--timeout-s",
            str(NOTICE_TIMEOUT_S),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        client = NodeClient(proc)

        reply = await client.wait_for("REPLY", timeout=15)
        rejected = _tagged(client.lines, "REJECTED")
        assert rejected is not None, client.output()
        assert rejected["type"] == "WorkloadRejected", client.output()
        assert rejected["field"] == "gpus", client.output()
        assert reply["type"] == "WorkloadAccepted", client.output()
        assert reply["allocation"] is None, client.output()
        filler = reply["workload_id"]

        # Accepted is not yet placed: submitting the allocated work before the filler runs
        # would place the allocated work first and leave nothing to preempt.
        running = await _wait_running(nc, filler, timeout=10)
        assert running["gpus"] == 8

        submit = {
            "type": "SubmitWorkload",
            "client_id": "py-1",
            "user": "ann",
            "gpus": 8,
            "allocation": "nlp",
            "min_runtime_s": 600,
        }
        answer = json.loads(
            (await nc.request("allot.v1.submit.nlp", json.dumps(submit).encode(), timeout=5)).data
        )
        assert answer["type"] == "WorkloadAccepted", answer

        code = await client.finish(NOTICE_TIMEOUT_S + 5)
        assert code == 0, client.output()
        notice = _tagged(client.lines, "NOTICE")
        assert notice is not None, client.output()
        assert notice["type"] == "PreemptionNotice", client.output()
        assert notice["reason"] == "displaced-unallocated", client.output()
        assert notice["workload_id"] == filler, client.output()
        assert notice["allocation"] is None, client.output()
        assert notice["preemptor"] == answer["workload_id"], client.output()
        assert notice["grace_deadline"] > notice["at"], client.output()
    except BaseException:
        if client is not None:
            print(client.output())
        print(_log_tails(tmp_path))
        raise
    finally:
        if client is not None and client.proc.returncode is None:
            client.proc.kill()
            await client.proc.wait()
        await nc.close()
        await asyncio.to_thread(stack.stop)
