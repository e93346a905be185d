"""One stack per run dir (``lock_run_dir``): a second ``allot up`` or ``allot demo`` in the
same folder is refused before it starts anything, instead of starting a second nats-server
on the first one's JetStream store. The lock dies with its process, even SIGKILLed."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from allot.adapters.embedded import free_ports
from allot.core.errors import ValidationError
from allot.ops import stack
from allot.ops.run_dir import LOCK_FILE, PORTS_FILE, running_stack_url
from allot.ops.stack import Stack, StackConfig, lock_run_dir

HOLD = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from allot.ops.stack import lock_run_dir\n"
    "lock_run_dir(Path(sys.argv[1]))\n"
    "print('locked', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_second_holder_is_refused_naming_the_first_until_it_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(ValidationError) as caught:
            lock_run_dir(tmp_path)
        assert caught.value.field == "--run-dir"
        assert f"pid {holder.pid}" in caught.value.reason and str(tmp_path) in caught.value.reason
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    fd = lock_run_dir(tmp_path)  # released by the kernel with the dead process
    assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    os.close(fd)


def test_a_stack_in_a_locked_run_dir_starts_nothing(tmp_path: Path) -> None:
    fd = lock_run_dir(tmp_path)
    stack = Stack(StackConfig(run_dir=tmp_path, fresh_store=True))
    try:
        (tmp_path / "jetstream").mkdir()  # the running stack's store
        with pytest.raises(ValidationError) as caught:
            stack.start()
        assert caught.value.field == "--run-dir"
        assert stack.procs == {}
        assert stack.servers.nats is None  # no embedded nats-server was started
        assert (tmp_path / "jetstream").is_dir()  # fresh_store did not remove it
    finally:
        stack.stop()  # stops whatever a broken lock would have let start
        os.close(fd)


def test_a_restarted_stack_takes_its_last_ports_again_when_free(tmp_path: Path) -> None:
    """Agents, SDK clients and exported URLs of the last stack find the next one."""
    port = stack.listen_port()
    stack.remember_ports(tmp_path, nats=port, dashboard=None)
    assert stack.remembered_port(tmp_path, "nats") == port
    with socket.socket() as taken:  # someone else holds it now: another free port
        taken.bind(("127.0.0.1", port))
        taken.listen()
        assert stack.remembered_port(tmp_path, "nats") != port
    assert stack.remembered_port(tmp_path, "dashboard") > 0  # never seen: a free one
    (tmp_path / PORTS_FILE).write_text("not json", encoding="utf-8")
    assert stack.remembered_port(tmp_path, "nats") > 0


def test_the_stacks_ports_are_outside_the_range_of_outgoing_connections(tmp_path: Path) -> None:
    """A port chosen now is bound seconds later (the dashboard, after the services have
    connected): one from the kernel's range for outgoing connections could be taken
    meanwhile as a connection's local end. An earlier run's port from that range is
    replaced."""
    low, high = stack._ephemeral_range()
    assert all(not low <= stack.listen_port() <= high for _ in range(20))
    (ephemeral,) = free_ports(1)  # the kernel's choice: inside the range
    stack.remember_ports(tmp_path, dashboard=ephemeral)
    assert not low <= stack.remembered_port(tmp_path, "dashboard") <= high


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize(
    ("lock", "ports", "secure", "url"),
    [
        pytest.param("self", {"nats": 4567}, False, "nats://127.0.0.1:4567", id="running"),
        pytest.param("dead", {"nats": 4567}, False, None, id="its-allot-up-has-exited"),
        pytest.param(None, {"nats": 4567}, False, None, id="never-locked"),
        pytest.param("self", {"dashboard": 8080}, False, None, id="nats-given-by-url"),
        pytest.param("self", {"nats": 4567}, True, None, id="secure-needs-credentials"),
        pytest.param("self", None, False, None, id="no-ports-file"),
    ],
)
def test_the_cli_finds_the_stack_running_in_its_run_dir(
    tmp_path: Path, lock: str | None, ports: dict[str, int] | None, secure: bool, url: str | None
) -> None:
    """What ``allot submit`` and friends use when no ALLOT_NATS_URL names a server: the
    stack of ./.allot if one runs there, not whatever answers on :4222."""
    if lock is not None:
        pid = os.getpid() if lock == "self" else _dead_pid()
        (tmp_path / LOCK_FILE).write_text(f"{pid}\n", encoding="utf-8")
    if ports is not None:
        (tmp_path / PORTS_FILE).write_text(json.dumps(ports), encoding="utf-8")
    if secure:
        (tmp_path / "auth").mkdir()
    assert running_stack_url(tmp_path) == url


def test_live_commands_default_to_the_stack_of_dot_allot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from allot.cli import live_cmds

    def parsed(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser(prog="allot")
        live_cmds.register(parser.add_subparsers(dest="command", required=True))
        return parser.parse_args(list(argv))

    run_dir = tmp_path / ".allot"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).write_text(f"{os.getpid()}\n", encoding="utf-8")
    (run_dir / PORTS_FILE).write_text('{"nats": 4567}', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ALLOT_NATS_URL", raising=False)
    monkeypatch.delenv("ALLOT_RUN_DIR", raising=False)
    # Resolved when the command runs, not when the parser is built (allot.cli.stack_url).
    assert live_cmds._nats_url(parsed("hosts")) == "nats://127.0.0.1:4567"
    monkeypatch.setenv("ALLOT_NATS_URL", "nats://elsewhere:4222")
    assert live_cmds._nats_url(parsed("hosts")) == "nats://elsewhere:4222"
