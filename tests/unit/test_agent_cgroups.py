"""``allot.services.agent.part_cgroup`` with real processes and a real cgroup v2 tree: what
leaves a part's session (``setsid``, even with ``env -i``) still ends with the part, and
a part run as its account cannot move itself out of its cgroup. Each escape is shown to
outlive the part without a cgroup first, so the assertions can fail."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.services.agent.accounts import account_of
from allot.services.agent.gpu_exec import ProcessPart
from allot.services.agent.part_cgroup import PartCgroup, check_root, leftovers
from allot.services.agent.part_names import part_of
from allot.services.agent.service import Agent, AgentConfig, Run, build_parser, config_from_args
from process_probe import running

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

ESCAPE = """setsid sh -c 'echo $$ > "$1"; exec env -i sleep 300' sh "$1" &"""
"""A launcher's child that leaves its session, and its markers, behind (it writes its pid
once out of the session)."""


async def _pid_in(path: Path) -> int:
    for _ in range(500):
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        await asyncio.sleep(0.01)
    raise AssertionError(f"nothing wrote {path}")


@pytest.fixture
def escaped() -> Iterator[list[int]]:
    """Pids a test let escape; whatever of them is still alive at its end is killed."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("name", "part"),
    [
        ("w1.1.h01", ("w1", 1, "h01")),
        ("train-7.12.gpu-a_3", ("train-7", 12, "gpu-a_3")),
        ("w1.x.h01", None),
        ("w1.1", None),
        ("w1.1.h01.more", None),
        (".1.h01", None),
        ("allot-probe-123", None),
    ],
)
def test_a_cgroups_name_tells_whose_part_it_is(
    name: str, part: tuple[str, int, str] | None
) -> None:
    assert part_of(name) == part


def test_a_root_that_is_no_cgroup_v2_directory_of_the_agents_alone_is_refused(
    cgroup_root: Path, tmp_path: Path
) -> None:
    assert check_root(cgroup_root) is None
    assert "not an absolute path" in (check_root(Path("relative")) or "")
    assert "no cgroup v2 directory" in (check_root(tmp_path) or "")
    assert "No such file" in (check_root(cgroup_root / "missing") or "")
    cgroup_root.chmod(0o777)
    assert "alone" in (check_root(cgroup_root) or "")
    cgroup_root.chmod(0o755)
    assert not [p for p in cgroup_root.iterdir() if p.is_dir()]  # the probe is gone
    if os.geteuid() == 0:  # a cgroup above delegated to an account (systemd's Delegate=)
        nobody = account_of("nobody", 1)
        delegated = cgroup_root / "delegated"
        delegated.mkdir()
        os.chown(delegated / "cgroup.procs", nobody.uid, nobody.gid)
        (delegated / "parts").mkdir()
        why = check_root(delegated / "parts") or ""
        assert why.startswith(f"{delegated / 'cgroup.procs'} may be written by uid {nobody.uid}")
        (delegated / "parts").rmdir()
        delegated.rmdir()
    with pytest.raises(ValidationError) as e:
        AgentConfig("nats://127.0.0.1:4222", ("h01",), cgroup_root=tmp_path)
    assert e.value.field == "cgroup_root"
    with pytest.raises(ValidationError, match="real mode"):
        AgentConfig("nats://127.0.0.1:4222", ("h01",), fake=True, cgroup_root=cgroup_root)


async def test_what_leaves_the_session_ends_with_the_part_only_with_a_cgroup(
    cgroup_root: Path, tmp_path: Path, escaped: list[int]
) -> None:
    env = dict(os.environ)
    for cgroup in (None, PartCgroup.make(cgroup_root, "w1", 1, "h01")):
        pidfile = tmp_path / f"escaped-{cgroup is not None}"
        part = await ProcessPart.spawn(
            ["/bin/sh", "-c", ESCAPE, "sh", str(pidfile)], env, time.time, cgroup=cgroup
        )
        pid = await _pid_in(pidfile)
        escaped.append(pid)
        assert os.getsid(pid) == pid  # out of the part's session, its process group too
        assert await part.wait() == 0
        # Without a cgroup the process group was all the part's end could reach.
        assert running(pid) is (cgroup is None)
    assert cgroup is not None
    assert not cgroup.path.exists()  # removed once empty


async def test_a_killed_part_takes_what_left_its_session_with_it(
    cgroup_root: Path, tmp_path: Path, escaped: list[int]
) -> None:
    pidfile = tmp_path / "escaped"
    part = await ProcessPart.spawn(
        ["/bin/sh", "-c", ESCAPE + " sleep 300", "sh", str(pidfile)],
        dict(os.environ),
        time.time,
        cgroup=PartCgroup.make(cgroup_root, "w1", 1, "h01"),
    )
    pid = await _pid_in(pidfile)
    escaped.append(pid)
    part.kill()
    # At once, not once the launcher is reaped (a launcher stuck in the kernel never is).
    for _ in range(200):
        if not running(pid):
            break
        time.sleep(0.01)  # blocking: the loop must not get to reap the launcher first
    assert not running(pid)
    assert await part.wait() == -signal.SIGKILL
    assert part.stopped
    assert not running(pid)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another account needs root")
async def test_a_part_run_as_its_account_is_in_its_cgroup_and_cannot_leave_it(
    cgroup_root: Path, open_dir: Path
) -> None:
    nobody = account_of("nobody", 1)
    cgroup = PartCgroup.make(cgroup_root, "w1", 1, "h01")
    out = open_dir / "out"
    script = (
        'id -u; id -G; grep "^0::" /proc/self/cgroup; '
        '{ echo $$ > "$1/cgroup.procs"; } 2>/dev/null && echo moved || echo refused'
    )
    with out.open("wb") as sink:
        part = await ProcessPart.spawn(
            ["/bin/sh", "-c", script, "sh", str(cgroup_root)],
            {"PATH": "/usr/bin:/bin", **nobody.env()},
            time.time,
            output=sink,
            account=nobody,
            cgroup=cgroup,
        )
    assert await part.wait() == 0
    output = out.read_text()
    uid, groups, where, moved = output.splitlines()
    assert uid == str(nobody.uid)
    assert sorted(map(int, groups.split())) == sorted(nobody.groups)  # none of root's
    assert where.endswith(f"/{cgroup_root.name}/w1.1.h01")
    assert moved == "refused"


async def test_a_restarted_agent_ends_its_hosts_leftover_cgroups_only(
    cgroup_root: Path, tmp_path: Path, escaped: list[int]
) -> None:
    procs = []
    for key in (("w1", 1, "h01"), ("w2", 3, "h02")):
        cgroup = PartCgroup.make(cgroup_root, *key)
        # As the agent starts a part (its entering runs syscalls only, safe beside threads).
        proc = subprocess.Popen(
            ["env", "-i", "sleep", "300"],
            preexec_fn=cgroup.entering(None),  # noqa: PLW1509
            start_new_session=True,
        )
        escaped.append(proc.pid)
        procs.append(proc)
    assert [c.path.name for c in leftovers(cgroup_root, lambda _w, _a, h: h == "h01")] == [
        "w1.1.h01"
    ]
    config = AgentConfig("nats://127.0.0.1:4222", ("h01",), cgroup_root=cgroup_root)
    await Agent(config)._end_leftover_cgroups(lambda _w, _a, host: host in config.hosts)
    assert procs[0].wait(timeout=5) == -signal.SIGKILL
    assert not (cgroup_root / "w1.1.h01").exists()
    assert procs[1].poll() is None  # another host's part
    assert (cgroup_root / "w2.3.h02").is_dir()


@pytest.mark.parametrize(
    ("command", "why"),
    [
        (("/no/such/program",), "cannot start '/no/such/program': No such file"),
        (("/bin/true",), "could not enter its cgroup"),
    ],
)
async def test_a_part_that_cannot_start_says_why_and_leaves_no_cgroup(
    cgroup_root: Path, command: tuple[str, ...], why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "cgroup" in why:  # its cgroup gone between its making and the child's entering it
        made = PartCgroup.make
        monkeypatch.setattr(
            PartCgroup, "make", lambda *a: PartCgroup(made(*a).path / "gone"), raising=True
        )
    agent = Agent(AgentConfig("nats://127.0.0.1:4222", ("h01",), cgroup_root=cgroup_root))
    task = m.HostTask(
        workload_id="w1", allocation="nlp", attempt=1, gpus=(0,), primary=True, command=command
    )
    run = Run(task=task, host="h01", log=None)
    reason = await agent._start_process(run, {}, None)
    assert isinstance(reason, str)
    assert why in reason
    assert not (cgroup_root / "w1.1.h01" / "gone").exists()
    if "cgroup" not in why:
        assert not (cgroup_root / "w1.1.h01").exists()


async def test_a_parts_end_waits_for_every_process_of_it_however_long(
    cgroup_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cgroup = PartCgroup.make(cgroup_root, "w1", 1, "h01")
    real_end, tries = PartCgroup.end, []

    async def end(self: PartCgroup, wait_s: float = 0.0) -> bool:
        # Two rounds in which a process survives SIGKILL (asleep in a hung file system).
        tries.append(wait_s)
        return False if len(tries) <= 2 else await real_end(self)

    monkeypatch.setattr(PartCgroup, "end", end)
    await cgroup.end_for_good()
    assert len(tries) == 3
    assert not cgroup.path.exists()


async def test_a_start_cancelled_after_the_fork_leaves_nothing_of_the_part_running(
    cgroup_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, escaped: list[int]
) -> None:
    pidfile = tmp_path / "escaped"
    real_exec = asyncio.create_subprocess_exec

    async def forked_then_cancelled(*args: Any, **kw: Any) -> Any:
        await real_exec("/bin/sh", "-c", ESCAPE, "sh", str(pidfile), preexec_fn=kw["preexec_fn"])
        escaped.append(await _pid_in(pidfile))
        raise asyncio.CancelledError  # the agent stopping while the part starts

    monkeypatch.setattr(asyncio, "create_subprocess_exec", forked_then_cancelled)
    agent = Agent(AgentConfig("nats://127.0.0.1:4222", ("h01",), cgroup_root=cgroup_root))
    task = m.HostTask(
        workload_id="w1", allocation="nlp", attempt=1, gpus=(0,), primary=True, command=("x",)
    )
    with pytest.raises(asyncio.CancelledError):
        await agent._start_process(Run(task=task, host="h01", log=None), {}, None)
    for _ in range(200):
        if not running(escaped[0]):
            break
        await asyncio.sleep(0.01)
    assert not running(escaped[0])


@pytest.mark.parametrize(
    ("args", "option", "reason"),
    [
        (["--fake", "--cgroup-root", "/tmp"], "--cgroup-root", "is for real mode"),
        (["--host", "h1", "--cgroup-root", "/tmp"], "--cgroup-root", "no cgroup v2 directory"),
        (["--host", "h1", "--pass-env", "X"], "--pass-env", "is for --run-as-user:"),
        pytest.param(
            ["--host", "h1", "--run-as-user"],
            "--output-dir",
            "is required with --run-as-user:",
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="--run-as-user needs root first"),
        ),
    ],
)
def test_the_agents_options_are_refused_naming_options(
    args: list[str], option: str, reason: str
) -> None:
    with pytest.raises(ValidationError) as e:
        config_from_args(build_parser().parse_args(args))
    assert e.value.field == option
    assert reason in e.value.reason
    assert "run_as_user" not in e.value.reason
