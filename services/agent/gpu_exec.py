"""One host's part of a workload, as the agent runs it: a real process group or a fake timer.

Both kinds answer the same three calls, so the agent's supervision code is one path:

* ``wait()`` returns the exit code (``asyncio``'s convention: ``-N`` when signal ``N``
  ended it);
* ``terminate(kill_at)`` asks the part to stop now (SIGTERM) and makes sure it is gone at
  wall-clock time ``kill_at`` (SIGKILL); a second call can only bring the deadline forward;
* ``kill()`` ends it at once (SIGKILL).

Real parts are started with ``start_new_session=True``: the workload's launcher and every
process it forks share one process group, and signals go to the whole group, so a training
script's data-loader workers do not outlive it. A process that leaves the group
(``setsid``) is held only by a cgroup of the part's own (``part_cgroup``, with the agent's
``--cgroup-root``). No shell is involved: ``command`` is the argument vector itself.

The environment of a part (``workload_env``) is the agent's own *minus every ``ALLOT_*``
variable* (the agent's NATS user and password, its Redis URL, its inbox prefix: a workload
must not log in as the host's agent; its user brings their own credentials) *and minus any
other variable whose value holds the agent's NATS password or token* (``agent_secrets``: a
``NATS_URL`` copied from a deployment's settings, say), plus what
the workload needs to know: ``ALLOT_NATS_URL`` without any user or password,
``CUDA_VISIBLE_DEVICES``, ``ALLOT_WORKLOAD_ID``, ``ALLOT_ALLOCATION``, ``ALLOT_ATTEMPT``,
``ALLOT_HOST`` and, when the agent knows the assignment's hosts, ``ALLOT_HOSTS``,
``ALLOT_HOST_RANK`` and ``ALLOT_NUM_HOSTS``. ``ALLOT_NATS_CA`` (a CA certificate's path,
not a secret) is passed on so the workload can reach a TLS server. The submission's own
``env`` (sbatch's ``--export NAME=VALUE``) comes between the two: over the agent's
environment, under what the agent sets (``messages.RESERVED_ENV``, which intake refuses in
a submission anyway).

``LeftoverSweep`` ends what an earlier agent process left running (see its docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from allot.services.agent.accounts import Account
from allot.services.agent.part_cgroup import PartCgroup

Clock = Callable[[], float]


class Part(Protocol):
    @property
    def pid(self) -> int | None: ...

    async def wait(self) -> int: ...

    def terminate(self, kill_at: float) -> None: ...

    def kill_by(self, kill_at: float) -> None:
        """SIGKILL at ``kill_at`` at the latest, sending nothing now (a notice's deadline,
        held whatever the notice's own steps meet)."""
        ...

    def kill(self) -> None: ...

    def send_signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the part now (the checkpoint protocol's notice)."""
        ...

    @property
    def stopped(self) -> bool:
        """``terminate`` or ``kill`` reached the part while it still ran: its end is the
        stopper's doing, not the workload's own."""
        ...


PASSED_ON = frozenset({"ALLOT_NATS_CA"})
"""The agent's only ``ALLOT_*`` variables a workload inherits (not secrets)."""
PART_MARKERS = ("ALLOT_WORKLOAD_ID", "ALLOT_ATTEMPT", "ALLOT_HOST")
"""Together, they name the part a process belongs to (``LeftoverSweep`` reads them)."""
AGENT_MARKER = "ALLOT_AGENT"
"""``<pid>:<start time>`` of the agent process that started a part (``agent_marker``): a
part is a leftover only once that process is gone, so a sweep never kills the work of a
live agent (a second agent started for the same host name, another cluster's agent)."""


def without_userinfo(url: str) -> str:
    """``url`` (comma-separated servers) with every ``user:password@`` (or token) removed."""
    out = []
    for part in url.split(","):
        pieces = urlsplit(part.strip())
        if pieces.username is None and pieces.password is None:
            out.append(part.strip())
        else:
            host = pieces.netloc.rpartition("@")[2]
            out.append(urlunsplit(pieces._replace(netloc=host)))
    return ",".join(out)


MIN_SECRET_LEN = 8
"""A password or token shorter than this only withholds a variable whose value is exactly
that secret (a short one would be found inside harmless values: ``PWD=/home/test``)."""


def agent_secrets(nats_url: str, environ: Mapping[str, str]) -> frozenset[str]:
    """The agent's NATS passwords and tokens: those in ``nats_url`` and in the environment's
    ``ALLOT_NATS_URL`` (each server's, as written and percent-decoded) and
    ``ALLOT_NATS_PASSWORD``."""
    found: set[str] = set()
    for url in (nats_url, environ.get("ALLOT_NATS_URL", "")):
        for part in url.split(","):
            pieces = urlsplit(part.strip())
            userinfo, at, _ = pieces.netloc.rpartition("@")
            if not at:
                continue
            user, colon, password = userinfo.partition(":")
            secret = password if colon else user  # no password: the user part is a token
            found.update((secret, unquote(secret)))
    found.add(environ.get("ALLOT_NATS_PASSWORD", ""))
    found.discard("")
    return frozenset(found)


def _holds(value: str, secrets: frozenset[str]) -> bool:
    return any(
        value == secret or (len(secret) >= MIN_SECRET_LEN and secret in value) for secret in secrets
    )


def workload_env(
    base: Mapping[str, str],
    *,
    gpus: Sequence[int],
    workload_id: str,
    allocation: str | None,
    attempt: int,
    nats_url: str,
    host: str,
    hosts: Sequence[str] = (),
    agent: str = "",
    extra: Mapping[str, str] | None = None,
    checkpoint_dir: str = "",
    session_dir: str = "",
) -> dict[str, str]:
    """The environment of one part (see the module docstring). ``base``: the agent's own
    environment; ``nats_url``: the URL it connects with. ``ALLOT_ALLOCATION`` is empty
    for unallocated work. ``hosts``: the assignment's hosts, primary first (empty, or
    without ``host``: unknown, the three gang variables are not set). ``extra``: the
    submission's own ``env``, over the agent's; what the agent sets comes last and wins.
    ``checkpoint_dir``, ``session_dir``: ``ALLOT_CHECKPOINT_DIR`` and ``ALLOT_SESSION_DIR``
    of work under the checkpoint protocol (issue 40; empty: not set)."""
    secrets = agent_secrets(nats_url, base)
    env = {
        k: v
        for k, v in base.items()
        if (not k.startswith("ALLOT_") or k in PASSED_ON) and not _holds(v, secrets)
    }
    env.update(extra or {})
    env.update(
        CUDA_VISIBLE_DEVICES=",".join(str(g) for g in gpus),
        ALLOT_WORKLOAD_ID=workload_id,
        ALLOT_ALLOCATION=allocation or "",
        ALLOT_ATTEMPT=str(attempt),
        ALLOT_NATS_URL=without_userinfo(nats_url),
        ALLOT_HOST=host,
    )
    if agent:
        env[AGENT_MARKER] = agent
    if checkpoint_dir:
        env["ALLOT_CHECKPOINT_DIR"] = checkpoint_dir
    if session_dir:
        env["ALLOT_SESSION_DIR"] = session_dir
    if host in hosts:
        env.update(
            ALLOT_HOSTS=",".join(hosts),
            ALLOT_HOST_RANK=str(list(hosts).index(host)),
            ALLOT_NUM_HOSTS=str(len(hosts)),
        )
    return env


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code}"


class ProcessPart:
    """A subprocess in its own session (process group id = its pid)."""

    def __init__(
        self, proc: asyncio.subprocess.Process, clock: Clock, cgroup: PartCgroup | None = None
    ) -> None:
        self._proc = proc
        self._clock = clock
        self._cgroup = cgroup
        self._kill_at: float | None = None
        self._kill_timer: asyncio.TimerHandle | None = None
        self._stopped = False
        self._terminated = False

    @classmethod
    async def spawn(
        cls,
        command: Sequence[str],
        env: Mapping[str, str],
        clock: Clock,
        *,
        output: IO[bytes] | None = None,
        account: Account | None = None,
        cgroup: PartCgroup | None = None,
    ) -> ProcessPart:
        """Raises ``OSError`` (e.g. ``FileNotFoundError``) when the program cannot start, or
        ``subprocess.SubprocessError`` when it could not enter ``cgroup`` (which tracks it
        and all it forks, ``part_cgroup``). ``output``: where its stdout and stderr go
        (None: the agent's own). ``account``: the user it runs as, in ``/`` (None: the
        agent's own, in its directory); ``env`` is the whole environment either way."""
        switch = account if cgroup is None else None  # with a cgroup, ``entering`` switches
        proc = await asyncio.create_subprocess_exec(
            *command,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=None if output is None else asyncio.subprocess.STDOUT,
            start_new_session=True,
            # In /: the child changes directory while still root, and would enter (or fail
            # to enter, under NFS root squash) a home its account could not.
            cwd=None if account is None else "/",
            user=None if switch is None else switch.uid,
            group=None if switch is None else switch.gid,
            # Its own groups, never the agent's: without them the child keeps root's.
            extra_groups=None if switch is None else list(switch.groups),
            preexec_fn=None if cgroup is None else cgroup.entering(account),
        )
        return cls(proc, clock, cgroup)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    async def wait(self) -> int:
        code = await self._proc.wait()
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        # The launcher is gone; whatever it forked goes with it: its group, or with a
        # cgroup all it holds, which has left the group too (and the end waits until
        # nothing of it runs). The cgroup's kill, not the group's: once reaped, the
        # launcher's pid may name another process's group.
        if self._cgroup is None:
            self._signal(signal.SIGKILL)
        else:
            await self._cgroup.end_for_good()
        return code

    @property
    def stopped(self) -> bool:
        return self._stopped

    def terminate(self, kill_at: float) -> None:
        if self._proc.returncode is not None:
            return
        self._note_stop()
        if not self._terminated:
            # Once per stop, as the contract says and Slurm does: a training loop may take a
            # second SIGTERM as "quit now" and abort the checkpoint it is writing. A later,
            # earlier deadline (a cancel during a notice) moves the SIGKILL only.
            self._terminated = True
            self._signal(signal.SIGTERM)
        self.kill_by(kill_at)

    def kill_by(self, kill_at: float) -> None:
        if self._proc.returncode is not None:
            return
        if self._kill_at is not None and self._kill_at <= kill_at:
            return  # a repeated request (each work list re-applied): the earlier deadline stands
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        self._kill_at = kill_at
        delay = max(0.0, kill_at - self._clock())
        self._kill_timer = asyncio.get_running_loop().call_later(delay, self.kill)

    def kill(self) -> None:
        if self._proc.returncode is None:
            self._note_stop()
            self._signal(signal.SIGKILL)
            if self._cgroup is not None:
                # Now, not once the launcher is reaped: it may never be (a hung file
                # system), and what left its group must not run on meanwhile.
                self._cgroup.kill()

    def send_signal(self, sig: signal.Signals) -> None:
        if self._proc.returncode is None:
            self._signal(sig)

    def _note_stop(self) -> None:
        """Remember whether this stop reached a running launcher. ``returncode`` is set a
        moment after the child exits (the child watcher reaps it, then tells the loop), so
        ask the kernel without reaping (``WNOWAIT``): a launcher that has exited, reaped or
        not, ended on its own."""
        if self._stopped:
            return
        try:
            ended = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # already reaped
            return
        self._stopped = ended is None

    def _signal(self, sig: signal.Signals) -> None:
        # The group may already be empty (ProcessLookupError) or, in theory, not ours any
        # more (PermissionError): either way there is nothing left to stop.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)


class FakePart:
    """Pretends to run for ``duration_s``; a stop request ends it at once (the fake
    checkpoint is instant), reported as SIGTERM's exit code."""

    def __init__(self, duration_s: float) -> None:
        self._duration_s = duration_s
        self._stop = asyncio.Event()
        self._code = -int(signal.SIGTERM)
        self._finished = False

    @property
    def pid(self) -> int | None:
        return None

    @property
    def stopped(self) -> bool:
        return self._stop.is_set() and not self._finished

    async def wait(self) -> int:
        try:
            await asyncio.wait_for(self._stop.wait(), self._duration_s)
        except TimeoutError:
            self._finished = True
            return 0
        return self._code

    def terminate(self, kill_at: float) -> None:
        self._stop.set()

    def kill_by(self, kill_at: float) -> None:
        """A fake part stops at once when asked (``terminate``): no deadline to hold."""

    def send_signal(self, sig: signal.Signals) -> None:
        """A fake part has no process to signal."""

    def kill(self) -> None:
        if not self._stop.is_set():
            self._code = -int(signal.SIGKILL)
        self._stop.set()


# ---------------------------------------------------------------------- leftovers
_PROC = Path("/proc")
_GONE = frozenset("ZXx")
"""``/proc/<pid>/stat`` states of a process that has exited (a zombie holds no GPU)."""
_STARTTIME = 19
"""Index of ``starttime`` (clock ticks after boot) after the ``(comm)`` field of ``stat``."""


@dataclass(frozen=True, slots=True)
class _Proc:
    pid: int
    sid: int
    started: int


def _read_stat(pid: int) -> _Proc | None:
    """None: gone, exited (a zombie) or unreadable."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after its last ")".
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) <= _STARTTIME or fields[0] in _GONE:
        return None
    return _Proc(pid=pid, sid=int(fields[3]), started=int(fields[_STARTTIME]))


def agent_marker(pid: int | None = None) -> str:
    """``AGENT_MARKER``'s value for process ``pid`` (default: this one): its pid and start
    time, which together never name another process (a pid may be reused; not with the
    same start time)."""
    proc = _read_stat(os.getpid() if pid is None else pid)
    return "" if proc is None else f"{proc.pid}:{proc.started}"


def _alive(marker: str) -> bool:
    """Whether the agent named by ``marker`` still runs (a malformed one counts as alive:
    a process whose agent cannot be told is never killed)."""
    pid, _, started = marker.partition(":")
    if not (pid.isdigit() and started.isdigit()):
        return True
    proc = _read_stat(int(pid))
    return proc is not None and proc.started == int(started)


def _part_of(pid: int) -> tuple[str, int, str] | None:
    """The part the process was started as (``PART_MARKERS`` of its environment), if the
    agent that started it (``AGENT_MARKER``) is gone; None for any other process: one with
    no markers (not a part), or whose agent still runs (not left over)."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or another user's process: not one of ours
        return None
    env: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            env[key] = value
    try:
        wid, attempt, host, agent = (
            env[k.encode()].decode() for k in (*PART_MARKERS, AGENT_MARKER)
        )
        part = (wid, int(attempt), host)
    except (KeyError, UnicodeDecodeError, ValueError):
        return None
    return None if _alive(agent) else part


def _kill_if_same(proc: _Proc) -> bool:
    """SIGKILL ``proc`` if its pid still names the process read (same start time); True
    when signalled. A pidfd pins the process between the check and the signal, so a pid
    reused in between is never hit."""
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfd (Linux < 5.3): check, then signal by pid (a tiny window)
        again = _read_stat(proc.pid)
        if again is None or again.started != proc.started:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGKILL)
            return True
        return False
    try:
        again = _read_stat(proc.pid)
        if again is None or again.started != proc.started:
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        os.close(fd)


class LeftoverSweep:
    """Finds and SIGKILLs the processes of parts an earlier agent process started (they run
    in sessions of their own, so they outlive a ``kill -9`` of the agent). Linux only
    (``/proc``); elsewhere ``supported`` is False and a sweep finds nothing.

    Which processes, and why this way (the work list carries no pid, and a pid alone may
    have been reused by an unrelated process since the earlier agent logged it):

    1. every live process whose environment names a part ``is_leftover`` accepts
       (``PART_MARKERS``, set by ``workload_env``: a reused pid belongs to a process with
       another environment, so it never matches) and whose starting agent
       (``AGENT_MARKER``) is gone: a live agent's parts, this agent's included, and
       processes without the marker are never touched;
    2. every process in the session of such a process that leads its session (the part's
       launcher: ``start_new_session``), even with an environment of its own (``env -i``),
       and in such a session found by an earlier call of this sweep. The kernel keeps a
       session id allocated while any process is in that session, so every member is a
       descendant of the launcher; a session is forgotten once a call finds it empty.

    Each is signalled through a pidfd after checking its start time again
    (``_kill_if_same``). ``__call__`` returns how many live processes it signalled: call it
    until it returns 0 (all gone: the part's GPUs are free)."""

    def __init__(self, is_leftover: Callable[[str, int, str], bool]) -> None:
        self._is_leftover = is_leftover
        self._sessions: set[int] = set()
        self.supported = _PROC.joinpath("self", "stat").exists()

    def __call__(self) -> int:
        if not self.supported:
            return 0
        me, own_session = os.getpid(), os.getsid(0)
        procs = [p for name in os.listdir(_PROC) if name.isdigit() and (p := _read_stat(int(name)))]
        marked: list[_Proc] = []
        for p in procs:
            part = _part_of(p.pid)
            if part is not None and self._is_leftover(*part):
                marked.append(p)
        self._sessions |= {p.sid for p in marked if p.sid == p.pid}
        self._sessions.discard(own_session)
        doomed = {p.pid: p for p in marked}
        doomed.update((p.pid, p) for p in procs if p.sid in self._sessions)
        self._sessions &= {p.sid for p in procs}
        doomed.pop(me, None)
        doomed.pop(1, None)
        return sum(_kill_if_same(p) for p in doomed.values())
