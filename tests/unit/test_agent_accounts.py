"""``--run-as-user``: which OS account a part runs as (``allot.services.agent.accounts``),
a real part started as it (uid, groups, directory, what it cannot read), and the agent's
file work for it done as that account, not as root (``checkpoint``): a link the workload
planted where the agent writes leads nowhere it could not write itself.

The cases that switch users need root (the agent's own requirement for the option); they
run as ``nobody`` (uid 65534), which every Linux has."""

from __future__ import annotations

import asyncio
import os
import pwd
import stat
import sys
import time
from pathlib import Path

import pytest

from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.proto.checkpoint_rules import NOTICE_FILE
from allot.services.agent import account_shell, accounts, checkpoint
from allot.services.agent.account_shell import as_account
from allot.services.agent.accounts import Account, account_of
from allot.services.agent.gpu_exec import ProcessPart
from allot.services.agent.safe_paths import open_output
from allot.services.agent.service import AgentConfig

as_root = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0, reason="switching users needs root on Linux"
)
NOBODY = "nobody"


def _dir(path: Path, mode: int) -> Path:
    """The directory ``path`` made with exactly ``mode`` (``mkdir`` applies the umask)."""
    path.mkdir()
    path.chmod(mode)
    return path


def _file(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def nobody() -> Account:
    return account_of(NOBODY, accounts.DEFAULT_MIN_UID)


# ---------------------------------------------------------------------- which account
@pytest.mark.parametrize(
    ("user", "min_uid", "reason"),
    [
        (None, 1000, "names no user"),
        ("", 1000, "names no user"),
        ("no-such-account-here", 1000, "has no account on this host"),
        ("root", 1000, "is uid 0, below this agent's --run-as-min-uid 1000"),
        ("daemon", 1000, "below this agent's --run-as-min-uid 1000"),
        (NOBODY, 65535, "is uid 65534, below this agent's --run-as-min-uid 65535"),
    ],
)
def test_an_account_that_may_not_run_work_is_refused_naming_user(
    user: str | None, min_uid: int, reason: str
) -> None:
    with pytest.raises(ValidationError) as e:
        account_of(user, min_uid)
    assert e.value.field == "user"
    assert reason in e.value.reason


def test_an_account_whose_uid_would_switch_nothing_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (uid_t)-1 tells setreuid "leave unchanged": the part would run as root.
    entry = pwd.struct_passwd(("evil", "x", 2**32 - 1, 1000, "", "/", "/bin/sh"))
    monkeypatch.setattr(accounts.pwd, "getpwnam", lambda name: entry)
    with pytest.raises(ValidationError) as e:
        account_of("evil", 1000)
    assert e.value.field == "user"
    assert "switches nothing" in e.value.reason


def test_an_account_in_roots_group_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = pwd.getpwnam(NOBODY)
    monkeypatch.setattr(accounts.os, "getgrouplist", lambda name, gid: [entry.pw_gid, 0])
    with pytest.raises(ValidationError) as e:
        account_of(NOBODY, 1000)
    assert (e.value.field, e.value.reason) == (
        "user",
        "'nobody' is in group 0 (root's): it runs no workloads",
    )


def test_an_account_is_its_uid_its_own_groups_and_its_home(nobody: Account) -> None:
    entry = pwd.getpwnam(NOBODY)
    assert (nobody.uid, nobody.gid) == (entry.pw_uid, entry.pw_gid)
    assert nobody.groups == tuple(sorted(set(os.getgrouplist(NOBODY, entry.pw_gid))))
    assert 0 not in nobody.groups
    assert nobody.home == entry.pw_dir
    assert nobody.env() == {
        "HOME": nobody.home,
        "USER": NOBODY,
        "LOGNAME": NOBODY,
        "SHELL": entry.pw_shell,
    }


def test_a_part_run_as_its_account_inherits_a_logins_environment_not_the_agents(
    nobody: Account,
) -> None:
    agent = {
        "PATH": "/opt/cuda/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "HOME": "/root",
        "USER": "root",
        "DEPLOY_TOKEN": "the operator's",
        "LD_LIBRARY_PATH": "/opt/cuda/lib",
    }
    assert nobody.base_env(agent) == {
        "PATH": "/opt/cuda/bin:/usr/bin",
        "LANG": "C.UTF-8",
        **nobody.env(),
    }
    assert nobody.base_env(agent, ("LD_LIBRARY_PATH", "NOT_SET"))["LD_LIBRARY_PATH"] == (
        "/opt/cuda/lib"
    )
    assert nobody.base_env({})["PATH"] == accounts.DEFAULT_PATH


def test_pass_env_is_for_run_as_user_and_never_passes_allot_variables(open_dir: Path) -> None:
    real = {"nats_url": "nats://127.0.0.1:4222", "hosts": ("h01",), "output_dir": open_dir}
    with pytest.raises(ValidationError, match="is for run_as_user") as e:
        AgentConfig(**real, pass_env=("LD_LIBRARY_PATH",))
    assert e.value.field == "pass_env"
    for name, why in (("ALLOT_NATS_PASSWORD", "never passed on"), ("A=B", "no variable name")):
        with pytest.raises(ValidationError, match=why) as e:
            AgentConfig(**real, run_as_user=True, pass_env=("LANG", name))
        assert e.value.field == "pass_env[1]"
    assert AgentConfig(**real, run_as_user=True, pass_env=("CUDA_HOME",)).pass_env == ("CUDA_HOME",)


# ---------------------------------------------------------------------- the option
def test_run_as_user_is_for_a_real_agent_running_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError) as e:
        AgentConfig(nats_url="nats://x", hosts=("h",), fake=True, run_as_user=True)
    assert (e.value.field, e.value.reason) == (
        "run_as_user",
        "is for real mode: fake parts run nothing",
    )
    monkeypatch.setattr(accounts, "can_switch", lambda: True)
    with pytest.raises(ValidationError) as e:
        AgentConfig(nats_url="nats://x", hosts=("h",), run_as_user=True)
    assert e.value.field == "output_dir"
    assert e.value.reason.startswith("is required with run_as_user")
    monkeypatch.setattr(accounts, "can_switch", lambda: False)
    with pytest.raises(ValidationError) as e:
        AgentConfig(nats_url="nats://x", hosts=("h",), run_as_user=True)
    assert e.value.field == "run_as_user"
    assert e.value.reason.startswith("needs the agent to run as root")
    with pytest.raises(ValidationError) as e:
        AgentConfig(nats_url="nats://x", hosts=("h",), run_as_min_uid=0)
    assert e.value.field == "run_as_min_uid"


# ---------------------------------------------------------------------- a part as it
@as_root
async def test_a_part_runs_as_its_account_in_the_root_dir_and_reads_none_of_roots_files(
    nobody: Account, open_dir: Path
) -> None:
    secret = _file(open_dir / "secret", "the agent's password", 0o600)
    script = 'id -u; id -g; id -G; pwd; echo "$HOME $USER"; cat "$1" || echo refused'
    out = open_dir / "out"
    with out.open("wb") as sink:
        part = await ProcessPart.spawn(
            ["/bin/sh", "-c", script, "sh", str(secret)],
            {"PATH": "/usr/bin:/bin", **nobody.env()},
            time.time,
            output=sink,
            account=nobody,
        )
    assert await part.wait() == 0
    lines = out.read_text().splitlines()
    assert lines[:5] == [
        str(nobody.uid),
        str(nobody.gid),
        " ".join(str(g) for g in nobody.groups),
        "/",  # not its home: the agent, still root, would change into it
        f"{nobody.home} {NOBODY}",
    ]
    assert "the agent's password" not in out.read_text()
    assert lines[-1] == "refused"


@as_root
async def test_the_shell_work_for_an_account_runs_as_it(nobody: Account) -> None:
    assert (await as_account(nobody, "id -u", timeout_s=30)).strip() == str(nobody.uid)
    with pytest.raises(OSError, match="boom"):
        await as_account(nobody, 'echo "$1" >&2; exit 3', "boom", timeout_s=30)
    # In a session of its own (no terminal of the agent's): it leads it.
    fields = (await as_account(nobody, "cat /proc/$$/stat", timeout_s=30)).split()
    assert fields[5] == fields[0]


@as_root
async def test_a_helper_the_workload_stops_or_floods_is_bounded(nobody: Account) -> None:
    started = time.monotonic()
    with pytest.raises(OSError, match="not done within 1 s as nobody"):
        await as_account(nobody, "kill -STOP $$", timeout_s=1.0)  # what its uid may do
    assert time.monotonic() - started < 10
    flood = await as_account(nobody, "head -c 5000000 /dev/zero | tr '\\0' x; echo", timeout_s=30)
    assert len(flood) == account_shell.OUTPUT_KEPT


# ---------------------------------------------------------------------- files as it
def _task(**kw: object) -> m.HostTask:
    return m.HostTask(
        workload_id="w1",
        allocation="nlp",
        attempt=1,
        gpus=(0,),
        primary=True,
        checkpoint=True,
        **kw,
    )


@as_root
async def test_the_notice_is_written_as_the_account_not_through_its_link_as_root(
    nobody: Account, open_dir: Path
) -> None:
    root = open_dir / "root"
    directory = await checkpoint.checkpoint_dir(_task(), root, (), nobody)
    assert directory == root / "nlp" / "w1"
    st = directory.lstat()
    assert (st.st_uid, st.st_mode & 0o777) == (nobody.uid, 0o700)
    precious = _file(open_dir / "precious", "root's", 0o644)
    # The workload planted a link where the notice goes, to a file only root may write.
    await as_account(
        nobody, 'ln -s "$1" "$2"', str(precious), str(directory / NOTICE_FILE), timeout_s=30
    )
    await checkpoint.write_notice(directory, 123.0, nobody, 30)
    assert precious.read_text() == "root's"
    # Without the link, the notice is written, and it is the account's.
    (directory / NOTICE_FILE).unlink()
    await checkpoint.write_notice(directory, 123.0, nobody, 30)
    assert (directory / NOTICE_FILE).read_text() == "123.000\n"
    assert (directory / NOTICE_FILE).stat().st_uid == nobody.uid


@as_root
async def test_a_checkpoint_dir_it_names_is_made_as_the_account_or_refused(
    nobody: Account, open_dir: Path
) -> None:
    allowed = _dir(open_dir / "team", 0o1777)
    named = allowed / "alice" / "run1"
    got = await checkpoint.checkpoint_dir(
        _task(checkpoint_dir=str(named)), None, (allowed,), nobody
    )
    assert got == named
    assert named.stat().st_uid == nobody.uid
    closed = open_dir / "closed"
    closed.mkdir(mode=0o755)  # root's: the account cannot create inside it
    with pytest.raises(ValidationError) as e:
        await checkpoint.checkpoint_dir(
            _task(checkpoint_dir=str(closed / "run")), None, (closed,), nobody
        )
    assert e.value.field == "checkpoint_dir"
    assert not (closed / "run").exists()


@as_root
async def test_a_managed_dir_that_is_a_link_or_anothers_is_refused(
    nobody: Account, open_dir: Path
) -> None:
    root = open_dir / "root"
    (root / "nlp").mkdir(parents=True)
    (root / "nlp" / "w1").symlink_to(open_dir)
    with pytest.raises(ValidationError) as e:
        await checkpoint.checkpoint_dir(_task(), root, (), nobody)
    assert e.value.field == "checkpoint_dir"
    assert open_dir.stat().st_uid == 0  # not handed over through the link
    (root / "nlp" / "w1").unlink()
    (root / "nlp" / "w1").mkdir()
    os.chown(root / "nlp" / "w1", 4242, 4242)
    with pytest.raises(ValidationError, match="belongs to uid 4242"):
        await checkpoint.checkpoint_dir(_task(), root, (), nobody)


@as_root
async def test_a_sessions_state_is_restored_and_saved_as_the_account(
    nobody: Account, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = await checkpoint.checkpoint_dir(_task(), open_dir / "root", (), nobody)
    live = open_dir / "scratch" / "w1.1.h01"
    assert await checkpoint.restore_session(directory, live, nobody) is False
    assert live.stat().st_uid == nobody.uid
    await as_account(nobody, 'echo one > "$1/state"', str(live), timeout_s=30)
    await checkpoint.save_session(live, directory, nobody)
    saved = directory / checkpoint.SESSION_STATE
    assert (saved / "state").read_text() == "one\n"
    assert (saved / "state").stat().st_uid == nobody.uid
    again = open_dir / "scratch" / "w1.2.h02"
    assert await checkpoint.restore_session(directory, again, nobody) is True
    assert (again / "state").read_text() == "one\n"
    await as_account(nobody, 'echo two > "$1/state"', str(again), timeout_s=30)
    await checkpoint.save_session(again, directory, nobody)
    assert (saved / "state").read_text() == "two\n"
    assert sorted(p.name for p in directory.iterdir()) == [checkpoint.SESSION_STATE]


@as_root
async def test_a_scratch_root_another_account_made_first_is_refused(
    nobody: Account, open_dir: Path
) -> None:
    scratch = _dir(open_dir / "scratch", 0o777)
    directory = await checkpoint.checkpoint_dir(_task(), open_dir / "root", (), nobody)
    with pytest.raises(OSError, match="not this agent's own directory"):
        await checkpoint.restore_session(directory, scratch / "w1.1.h01", nobody)
    scratch.chmod(0o755)
    os.chown(scratch, nobody.uid, nobody.gid)
    with pytest.raises(OSError, match="not this agent's own directory"):
        await checkpoint.restore_session(directory, scratch / "w1.1.h01", nobody)


@as_root
def test_an_output_file_planted_as_a_link_or_a_second_name_is_refused(
    nobody: Account, open_dir: Path
) -> None:
    out_dir = _dir(open_dir / "out", 0o1777)  # an output directory left open to everyone
    precious = open_dir / "precious"
    precious.write_text("root's")
    (out_dir / "w1.1.h01.out").symlink_to(precious)
    with pytest.raises(OSError):
        open_output(out_dir / "w1.1.h01.out", nobody)
    os.link(precious, out_dir / "w2.1.h01.out")
    with pytest.raises(OSError, match="not a file of its own"):
        open_output(out_dir / "w2.1.h01.out", nobody)
    # A FIFO: opened without blocking, refused either way (ENXIO with no reader).
    fifo = out_dir / "w4.1.h01.out"
    os.mkfifo(fifo)
    for account in (nobody, None):
        with pytest.raises(OSError, match="No such device"):
            open_output(fifo, account)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            with pytest.raises(OSError, match="not a file of its own"):
                open_output(fifo, account)
        finally:
            os.close(reader)
    assert precious.stat().st_uid == 0 and precious.read_text() == "root's"
    with open_output(out_dir / "w3.1.h01.out", nobody) as sink:
        sink.write(b"ok\n")
    assert (out_dir / "w3.1.h01.out").stat().st_uid == nobody.uid


@as_root
async def test_a_managed_roots_allocation_dir_that_is_a_link_is_refused(
    nobody: Account, open_dir: Path
) -> None:
    root = open_dir / "root"
    root.mkdir()
    elsewhere = open_dir / "elsewhere"
    elsewhere.mkdir()
    (root / "nlp").symlink_to(elsewhere)
    with pytest.raises(ValidationError, match="not this agent's own directory"):
        await checkpoint.checkpoint_dir(_task(), root, (), nobody)
    assert list(elsewhere.iterdir()) == []
    # Others may write it: a link could appear there at any time.
    open_root = _dir(open_dir / "open-root", 0o777)
    with pytest.raises(ValidationError, match="not this agent's own directory"):
        await checkpoint.checkpoint_dir(_task(), open_root, (), nobody)


@as_root
async def test_a_fifo_at_the_notice_path_is_refused_at_once_by_the_account_and_the_agent(
    nobody: Account, open_dir: Path
) -> None:
    directory = await checkpoint.checkpoint_dir(_task(), open_dir / "root", (), nobody)
    await as_account(nobody, 'mkfifo "$1"', str(directory / NOTICE_FILE), timeout_s=30)
    started = time.monotonic()
    await checkpoint.write_notice(directory, 123.0, nobody, 1.0)  # as the account
    await checkpoint.write_notice(directory, 123.0, None, 1.0)  # as the agent itself
    assert time.monotonic() - started < 10
    assert stat.S_ISFIFO((directory / NOTICE_FILE).lstat().st_mode)


@as_root
@pytest.mark.parametrize("field", ["checkpoint_root", "session_root"])
def test_with_run_as_user_a_root_others_could_swap_is_refused(open_dir: Path, field: str) -> None:
    def refused(root: Path) -> str:
        with pytest.raises(ValidationError) as e:
            AgentConfig(
                nats_url="nats://x",
                hosts=("h",),
                output_dir=open_dir / "out",
                run_as_user=True,
                **{field: root},
            )
        assert e.value.field == field
        return e.value.reason

    # Writable by all, not sticky: a directory under it could be swapped.
    team = _dir(open_dir / "team", 0o777)
    assert (
        refused(team / "ckpt")
        == f"with run_as_user: {team} may be written by others (and is not sticky)"
    )
    os.chown(team, nobody_uid := pwd.getpwnam(NOBODY).pw_uid, nobody_uid)
    team.chmod(0o755)
    assert (
        refused(team / "ckpt")
        == f"with run_as_user: {team} belongs to uid {nobody_uid}, not to root"
    )
    (open_dir / "link").symlink_to(open_dir)
    assert "is a link" in refused(open_dir / "link" / "ckpt")
    # Fine on the way, not as the root itself (others write in it).
    sticky = _dir(open_dir / "sticky", 0o1777)
    assert refused(sticky) == f"with run_as_user: {sticky} may be written by others"
    # Under a sticky /tmp, in root's own directory: taken.
    config = AgentConfig(
        nats_url="nats://x",
        hosts=("h",),
        output_dir=open_dir / "out",
        run_as_user=True,
        **{field: open_dir / "ckpt"},
    )
    assert getattr(config, field) == open_dir / "ckpt"
    if field == "session_root":  # where sessions' live directories go
        task = _task(session=True)
        assert checkpoint.session_dir(task, "h01", config.session_root) == (
            open_dir / "ckpt" / "w1.1.h01"
        )
        assert checkpoint.session_dir(task, "h01").parent == checkpoint.SESSION_SCRATCH


@as_root
async def test_a_helper_returns_when_it_ends_though_a_process_still_holds_its_output(
    nobody: Account,
) -> None:
    # A process of the account keeping the helper's output open (here one it started in a
    # session of its own; a workload may take a copy of its descriptors) holds no one.
    started = time.monotonic()
    out = await as_account(nobody, "setsid sleep 20 & echo done", timeout_s=30)
    assert out.strip() == "done"
    assert time.monotonic() - started < 10


@as_root
async def test_a_directory_above_the_root_made_by_an_account_since_the_start_is_refused(
    nobody: Account, open_dir: Path
) -> None:
    sticky = _dir(open_dir / "sticky", 0o1777)
    root = sticky / "late" / "managed"
    config = AgentConfig(
        nats_url="nats://x",
        hosts=("h",),
        output_dir=open_dir / "out",
        checkpoint_root=root,
        run_as_user=True,
    )  # "late" does not exist yet: nothing to refuse
    await as_account(nobody, 'mkdir -m 777 "$1"', str(sticky / "late"), timeout_s=30)
    with pytest.raises(ValidationError, match=f"{sticky / 'late'} belongs to uid"):
        await checkpoint.checkpoint_dir(_task(), config.checkpoint_root, (), nobody)
    assert not root.exists()


@as_root
async def test_a_helper_whose_caller_is_cancelled_is_killed(
    nobody: Account, open_dir: Path
) -> None:
    pid_file = _file(open_dir / "pid", "", 0o666)
    task = asyncio.create_task(
        as_account(nobody, 'echo $$ > "$1"; exec sleep 30', str(pid_file), timeout_s=60)
    )
    while not pid_file.read_text().strip():
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not Path(f"/proc/{pid_file.read_text().strip()}").exists()  # killed and reaped
