"""What an ``allot up`` leaves for others to find it, and how the CLI finds it.

In its run directory: the lock that says it runs (``LOCK_FILE``, its pid) and the ports it
listens on (``PORTS_FILE``). In the folder it was started from: a line in
``.allot/stacks`` naming that run directory (``record_stack``), so ``make up`` (run dir
``out/up``) and ``allot up --run-dir DIR`` are found by an ``allot queue`` typed in the same
folder, as the default run dir ``.allot`` is.

``find_stack`` is how the CLI picks a server when none is named (no ``--nats-url``, no
``ALLOT_NATS_URL``): the stack of ``$ALLOT_RUN_DIR``, else the one stack running from this
folder or the nearest parent that has one. None found is an error that says what to
export (``NoStackError``), never a default server: 127.0.0.1:4222 is often another
team's (docs/decisions/0040).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_RUN_DIR = Path(".allot")
LOCK_FILE = "allot.lock"
PORTS_FILE = "ports.json"
"""The ports a stack in this run dir listened on: the next ``allot up`` there takes them
again when free, so agents, SDK clients and exported URLs reconnect after a restart.
``redis`` is only read by the CLI (the embedded Redis keeps nothing, so no port is kept)."""

RUN_DIR_ENV = "ALLOT_RUN_DIR"
"""A run directory: the CLI's stack, and ``allot up``'s ``--run-dir`` default."""

STACKS_FILE = "stacks"
"""``<folder>/.allot/stacks``: one absolute run directory a line, each a stack started
from ``<folder>`` (stale lines are dropped at the next record)."""


@dataclass(frozen=True)
class RunningStack:
    """A stack whose ``allot up`` (or ``allot demo``) still runs. ``nats_url`` and
    ``redis_url`` are its embedded servers' (None for a server it was given by URL);
    ``secure``: ``--secure``, whose users need their own credentials file."""

    run_dir: Path
    nats_url: str | None
    redis_url: str | None
    secure: bool


class NoStackError(Exception):
    """No server named and no running stack found; the message says what to export."""


def running_stack(run_dir: Path) -> RunningStack | None:
    """The stack running in ``run_dir`` (its lock's pid is alive), or None."""
    try:
        pid = int((run_dir / LOCK_FILE).read_text(encoding="utf-8").strip())
        ports = json.loads((run_dir / PORTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(ports, dict) or not _alive(pid):
        return None
    nodes = ports.get("nats_nodes")  # allot up --nats-cluster: every node, so any may be down
    urls = [u for p in nodes if (u := _url("nats", p))] if isinstance(nodes, list) else []
    return RunningStack(
        run_dir=run_dir,
        nats_url=",".join(urls) if urls else _url("nats", ports.get("nats")),
        redis_url=_url("redis", ports.get("redis")),
        secure=(run_dir / "auth").exists(),
    )


def running_stack_url(run_dir: Path = DEFAULT_RUN_DIR) -> str | None:
    """``nats://127.0.0.1:<port>`` of the stack running in ``run_dir``, or None: none runs
    there, it uses a server given by URL (no port remembered), or it is ``--secure`` (its
    users need their own credentials file: ``<run-dir>/auth/users/<user>.env``)."""
    stack = running_stack(run_dir)
    if stack is None or stack.secure:
        return None
    return stack.nats_url


def record_stack(run_dir: Path, folder: Path) -> None:
    """Note in ``folder/.allot/stacks`` that a stack runs in ``run_dir`` (called by the
    stack's own process, once it holds the run dir's lock). Lines of stacks no longer
    running are dropped. ``folder/.allot`` gets a ``.gitignore`` of ``*`` when this creates
    it: it is run state, never a file to commit."""
    run_dir = run_dir.resolve()
    others = [d for d in _recorded(folder) if d != run_dir and running_stack(d) is not None]
    _write_records(folder, [*others, run_dir])


def forget_stack(run_dir: Path, folder: Path) -> None:
    """Remove ``run_dir``'s line from ``folder/.allot/stacks`` (the stack stopped)."""
    run_dir = run_dir.resolve()
    recorded = _recorded(folder)
    if run_dir in recorded:
        _write_records(folder, [d for d in recorded if d != run_dir])


def stacks_from(folder: Path) -> list[RunningStack]:
    """The running stacks started from ``folder`` or, when none, from its nearest parent
    that has one (as git finds its repository): ``DEFAULT_RUN_DIR`` itself and the run
    dirs recorded there."""
    for place in (folder.resolve(), *folder.resolve().parents):
        candidates = [place / DEFAULT_RUN_DIR, *_recorded(place)]
        found: dict[Path, RunningStack] = {}
        for run_dir in candidates:
            stack = running_stack(run_dir)
            if stack is not None:
                found.setdefault(run_dir.resolve(), stack)
        if found:
            return list(found.values())
    return []


def find_stack(environ: Mapping[str, str], folder: Path) -> RunningStack:
    """The stack the CLI talks to when no server is named: ``$ALLOT_RUN_DIR``'s, else the
    only one ``stacks_from(folder)`` finds. ``NoStackError`` otherwise, saying what to
    export (see ``no_stack_text``)."""
    given = environ.get(RUN_DIR_ENV)
    if given:
        stack = running_stack(Path(given))
        if stack is None:
            raise NoStackError(
                f"no Allot stack runs in {RUN_DIR_ENV}={given} (no live allot up holds "
                f"{Path(given) / LOCK_FILE}): start one there (allot up --run-dir {given}), "
                f"or unset {RUN_DIR_ENV}"
            )
        return stack
    stacks = stacks_from(folder)
    if not stacks:
        raise NoStackError(no_stack_text(folder))
    if len(stacks) > 1:
        dirs = ", ".join(str(st.run_dir) for st in stacks)
        raise NoStackError(
            f"{len(stacks)} Allot stacks run from here ({dirs}): choose one with "
            f"export {RUN_DIR_ENV}=<one of them> (or export ALLOT_NATS_URL=<its URL>)"
        )
    return stacks[0]


def no_stack_text(folder: Path) -> str:
    return (
        f"no Allot stack found: none was started from {folder.resolve()} or a parent "
        f"folder (make up, allot up), {RUN_DIR_ENV} is not set, and no server is named. "
        "Start one here (make up, or allot up), or say where it runs: "
        f"export {RUN_DIR_ENV}=<its --run-dir>, or export ALLOT_NATS_URL=nats://HOST:PORT "
        "(allot up prints it; compose: nats://127.0.0.1:4222), or pass --nats-url"
    )


def stack_nats_url(stack: RunningStack) -> str:
    """``stack``'s NATS URL for a client, or ``NoStackError`` saying what to export: a
    ``--secure`` stack needs a user's credentials, a given server its URL."""
    if stack.secure:
        users = stack.run_dir / "auth" / "users"
        raise NoStackError(
            f"the stack in {stack.run_dir} runs --secure: log in as one of its users "
            f"(the file holds its URL, password and CA): set -a; . {users}/<user>.env; set +a"
        )
    if stack.nats_url is None:
        raise NoStackError(
            f"the stack in {stack.run_dir} uses a NATS server it was given (allot up "
            "--nats-url): export ALLOT_NATS_URL=<that URL>"
        )
    return stack.nats_url


def stack_redis_url(stack: RunningStack) -> str:
    """``stack``'s Redis URL, or ``NoStackError`` saying what to export."""
    if stack.redis_url is None:
        raise NoStackError(
            f"the stack in {stack.run_dir} uses a Redis server it was given (allot up "
            "--redis-url): export ALLOT_REDIS_URL=<that URL>"
        )
    return stack.redis_url


def _url(scheme: str, port: object) -> str | None:
    if isinstance(port, int) and 0 < port < 65536:
        return f"{scheme}://127.0.0.1:{port}"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal sent: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True


def _recorded(folder: Path) -> list[Path]:
    try:
        text = (folder / DEFAULT_RUN_DIR / STACKS_FILE).read_text(encoding="utf-8")
    except OSError:
        return []
    return [Path(line) for line in text.splitlines() if line.strip()]


def _write_records(folder: Path, run_dirs: list[Path]) -> None:
    place = folder / DEFAULT_RUN_DIR
    path = place / STACKS_FILE
    if not run_dirs:
        path.unlink(missing_ok=True)
        return
    if not place.exists():
        place.mkdir(parents=True)
        (place / ".gitignore").write_text("*\n", encoding="utf-8")
    tmp = path.with_name(f".{STACKS_FILE}.{os.getpid()}")
    tmp.write_text("".join(f"{d}\n" for d in run_dirs), encoding="utf-8")
    tmp.replace(path)
