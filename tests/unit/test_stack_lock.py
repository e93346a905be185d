"""One stack per run dir (``lock_run_dir``): a second ``allot up`` or ``allot demo`` in the
same folder is refused before it starts anything, instead of starting a second nats-server
on the first one's JetStream store. The lock dies with its process, even SIGKILLed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from allot.adapters.embedded import free_ports
from allot.core.errors import ValidationError
from allot.live import stack
from allot.live.stack import LOCK_FILE, Stack, StackConfig, lock_run_dir

HOLD = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from allot.live.stack import lock_run_dir\n"
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
    port = free_ports(1)[0]
    stack.remember_ports(tmp_path, nats=port, dashboard=None)
    assert stack.remembered_port(tmp_path, "nats") == port
    with socket.socket() as taken:  # someone else holds it now: another free port
        taken.bind(("127.0.0.1", port))
        taken.listen()
        assert stack.remembered_port(tmp_path, "nats") != port
    assert stack.remembered_port(tmp_path, "dashboard") > 0  # never seen: a free one
    (tmp_path / stack.PORTS_FILE).write_text("not json", encoding="utf-8")
    assert stack.remembered_port(tmp_path, "nats") > 0
