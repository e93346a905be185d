"""What an ``allot up`` leaves in its run directory for others to find it: the lock that
says it runs (``LOCK_FILE``, its pid) and the ports it listens on (``PORTS_FILE``).

``running_stack_url`` is how the CLI finds the stack of ``./.allot`` when no server is
named: a user who forgot ``export ALLOT_NATS_URL`` after ``allot up`` would otherwise send
submissions, cancels and drains to whatever answers on 127.0.0.1:4222 (found by a user
trial, 2026-12-03: on this machine another team's server)."""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_RUN_DIR = Path(".allot")
LOCK_FILE = "allot.lock"
PORTS_FILE = "ports.json"
"""The ports a stack in this run dir listened on: the next ``allot up`` there takes them
again when free, so agents, SDK clients and exported URLs reconnect after a restart
(found 2026-12-03: every restart moved NATS to a new port and nothing found it again)."""


def running_stack_url(run_dir: Path = DEFAULT_RUN_DIR) -> str | None:
    """``nats://127.0.0.1:<port>`` of the stack running in ``run_dir`` (its lock's pid is
    alive), or None: none runs there, it uses a server given by URL (no port remembered),
    or it is ``--secure`` (its users need their own credentials file: ``ALLOT_NATS_URL``
    and the rest come from ``<run-dir>/auth/users/<user>.env``)."""
    try:
        pid = int((run_dir / LOCK_FILE).read_text(encoding="utf-8").strip())
        ports = json.loads((run_dir / PORTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    port = ports.get("nats") if isinstance(ports, dict) else None
    if not isinstance(port, int) or not 0 < port < 65536 or (run_dir / "auth").exists():
        return None
    try:
        os.kill(pid, 0)  # no signal sent: only whether the process exists
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return f"nats://127.0.0.1:{port}"
