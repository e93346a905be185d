"""A cgroup of its own for each part (``--cgroup-root``), as Slurm's ``proctrack/cgroup``
tracks a job's processes.

Without it a part is its process group: a process that leaves the group (``setsid``, a
daemon's double fork) outlives the part's end and keeps its GPUs after a preemption. With
it, the child enters the part's cgroup between fork and exec, while still root (a process
moves only where it may write ``cgroup.procs``; an account cannot write root's), and only
then becomes its account; everything it forks is born inside and stays there. The part's
end kills the whole cgroup at once (``cgroup.kill``: no fork outruns it) and waits until
it is empty, so the end reported is the end of every process. Signals before the end
(the notice, SIGTERM) still go to the part's process group: what left it gets only the
final SIGKILL.

cgroup v2 with ``cgroup.kill`` (Linux 5.14) only; the root must be a v2 cgroup directory
the agent may make children in and no other user may write (``check_root``, at start).
A part's cgroup is named by ``part_names``, so a restarted agent knows whose a leftover
one is (``leftovers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from allot.services.agent.accounts import Account
from allot.services.agent.part_names import part_name, part_of

log = structlog.get_logger("allot.agent", service="agent")

END_WAIT_S = 5.0
"""How long one ``end`` waits for a killed cgroup to empty (a process in the kernel's
uninterruptible sleep dies only when it wakes)."""
_PROBE = "allot-probe"


@dataclass(frozen=True, slots=True)
class PartCgroup:
    path: Path

    @classmethod
    def make(cls, root: Path, workload_id: str, attempt: int, host: str) -> PartCgroup:
        """The part's cgroup under ``root`` (an existing one of the same name is reused: the
        start of an agent already ended whatever ran in it). Raises ``OSError``."""
        cgroup = cls(root / part_name(workload_id, attempt, host))
        cgroup.path.mkdir(exist_ok=True)
        return cgroup

    def entering(self, account: Account | None) -> Callable[[], None]:
        """What the child runs between fork and exec: into this cgroup as root, then (with
        ``account``) become the account, as ``subprocess``'s own ``user``, ``group`` and
        ``extra_groups`` would (which it runs before this: too late to move). Only system
        calls, no lock a thread of the agent's could hold across the fork: safe as a
        ``preexec_fn`` beside the agent's threads."""
        procs = str(self.path / "cgroup.procs")

        def enter() -> None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")  # "0": the writing process itself
            finally:
                os.close(fd)
            if account is not None:
                os.setgroups(list(account.groups))
                os.setregid(account.gid, account.gid)
                os.setreuid(account.uid, account.uid)

        return enter

    def kill(self) -> None:
        """SIGKILL every process in the cgroup (none left, or the cgroup gone: nothing)."""
        with contextlib.suppress(FileNotFoundError):
            (self.path / "cgroup.kill").write_text("1")

    def populated(self) -> bool:
        try:
            events = (self.path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False
        return "populated 1" in events.splitlines()

    def remove(self) -> bool:
        """Remove the (empty) cgroup; False while a process is still in it."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    async def end(self, wait_s: float = END_WAIT_S) -> bool:
        """Kill what is in the cgroup and remove it once empty; False when processes were
        still in it after ``wait_s`` seconds."""
        self.kill()
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + wait_s, 0.005
        while self.populated():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
        return self.remove()

    async def end_for_good(self, bound: Any = None) -> None:
        """``end`` until the cgroup is gone, however long it takes: processes that survive
        SIGKILL (asleep in the kernel: a hung file system) still hold the part's GPUs and
        files, so the part has not ended (as slurmd keeps an unkillable step). Logged
        every ``END_WAIT_S``."""
        while not await self.end():
            (bound or log).error(
                "processes of a part survive SIGKILL; its end waits for them",
                cgroup=str(self.path),
                pids=self.pids()[:10],
            )


def leftovers(root: Path, is_leftover: Callable[[str, int, str], bool]) -> list[PartCgroup]:
    """The parts' cgroups under ``root`` that ``is_leftover`` accepts."""
    found = []
    for entry in os.scandir(root):
        part = part_of(entry.name)
        if entry.is_dir(follow_symlinks=False) and part is not None and is_leftover(*part):
            found.append(PartCgroup(Path(entry.path)))
    return found


_MOVES = ("", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control")
"""A cgroup's directory and the files through which processes move into it or under it."""


def _open_to_others(root: Path) -> str | None:
    """Why a process of another user could move itself out of a cgroup under ``root``
    (None: none can). Moving from one cgroup to another needs write access to
    ``cgroup.procs`` of the target and of their common ancestor: so ``root`` and every
    cgroup above it (up to the hierarchy's root) must be root's or the agent's, closed to
    others, as must the files that move processes (a delegated cgroup's are its user's)."""
    me = os.geteuid()
    for cgroup in (root, *root.parents):
        if not (cgroup / "cgroup.controllers").is_file():
            return None  # above the hierarchy's root
        for name in _MOVES:
            try:
                st = os.stat(cgroup / name) if name else os.lstat(cgroup)
            except FileNotFoundError:
                continue
            except OSError as e:
                return f"{cgroup / name}: {e.strerror or e}"
            if st.st_uid not in (0, me) or st.st_mode & 0o022:
                return (
                    f"{cgroup / name} may be written by uid {st.st_uid} or others: a part could "
                    "move itself out of its cgroup through it"
                )
    return None


def check_root(root: Path) -> str | None:
    """Why ``root`` cannot hold the parts' cgroups (None: it can). It must be an absolute
    cgroup v2 directory of this process's user that no one else may write, in which this
    process can make a cgroup that has ``cgroup.kill``."""
    if not root.is_absolute():
        return f"{root} is not an absolute path"
    try:
        st = os.lstat(root)
    except OSError as e:
        return f"{root}: {e.strerror or e}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{root} is not a directory"
    if not (root / "cgroup.controllers").is_file():
        return f"{root} is no cgroup v2 directory (it has no cgroup.controllers)"
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return f"{root} must be this agent's user's alone (uid {os.geteuid()}, closed to others)"
    why = _open_to_others(root)
    if why is not None:
        return why
    probe = PartCgroup(root / f"{_PROBE}-{os.getpid()}")
    try:
        probe.path.mkdir(exist_ok=True)
    except OSError as e:
        return f"cannot make a cgroup in {root}: {e.strerror or e}"
    try:
        if not (probe.path / "cgroup.kill").exists():
            return "this kernel has no cgroup.kill (Linux 5.14 or later is needed)"
    finally:
        probe.remove()
    return None


__all__ = ["END_WAIT_S", "PartCgroup", "check_root", "leftovers"]
