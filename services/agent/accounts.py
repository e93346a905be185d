"""The OS account a part runs as under ``--run-as-user`` (Slurm's model: a job runs as the
user who submitted it, whose account every host shares through LDAP or the like).

The submission's ``user`` is its sender's login under ``allot auth gen``'s credentials
(intake checks it), so the account is the login's name on the host. The agent (root)
switches to it for the part: uid, primary gid and the account's own groups (never the
agent's: root's group would come along), home directory and ``HOME``/``USER``/``LOGNAME``.
A part whose user has no account here, or an account below ``--run-as-min-uid`` (root and
the system accounts: a login named ``root`` or ``daemon`` must not run as them), or one in
group 0, is refused before it starts, the reason naming ``user``.

The agent's own file work for such a part (the checkpoint directory it names, the notice,
a session's state) runs as the account too (``as_account``): as root it would follow links
the workload planted to files only root may write.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
from dataclasses import dataclass

from allot.core.errors import ValidationError

DEFAULT_MIN_UID = 1000
"""The lowest uid a part may run as (Debian's and Red Hat's first user account)."""
NO_ID = 2**32 - 1
"""``(uid_t)-1``: to ``setreuid`` and ``setregid``, "leave unchanged"."""
HELPER_PATH = "/usr/bin:/bin"
"""``PATH`` of the shell commands run as an account (``as_account``)."""


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    """The account's home directory, or ``/`` when it has none here (the part's cwd)."""

    def env(self) -> dict[str, str]:
        """What ``login`` sets of the environment for this account."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def can_switch() -> bool:
    """Whether this process may become another user (root)."""
    return os.geteuid() == 0


def account_of(user: str | None, min_uid: int) -> Account:
    """The account ``user`` runs as here; ``ValidationError`` naming ``user`` when none may."""
    if not user:
        raise ValidationError(
            "user",
            "the part names no user, and this agent runs each part as its user "
            "(--run-as-user): upgrade the dispatch service",
        )
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValidationError(
            "user", f"{user!r} has no account on this host (--run-as-user runs parts as it)"
        ) from None
    if NO_ID in (entry.pw_uid, entry.pw_gid):
        # (uid_t)-1 tells setreuid "leave it unchanged": the part would stay root.
        raise ValidationError("user", f"{user!r} has uid or gid {NO_ID}, which switches nothing")
    if entry.pw_uid < min_uid:
        raise ValidationError(
            "user",
            f"{user!r} is uid {entry.pw_uid}, below this agent's --run-as-min-uid {min_uid}: "
            "root and system accounts run no workloads",
        )
    groups = tuple(sorted(set(os.getgrouplist(user, entry.pw_gid))))
    if 0 in groups:
        raise ValidationError("user", f"{user!r} is in group 0 (root's): it runs no workloads")
    home = entry.pw_dir if os.path.isdir(entry.pw_dir) else "/"
    return Account(user, entry.pw_uid, entry.pw_gid, groups, home)


OUTPUT_KEPT = 4096
"""Bytes of a helper's standard output and error kept (the rest is read and dropped)."""
KILLED_WAIT_S = 5.0
"""How long a killed helper may take to be reaped."""


class _Drain:
    """The read ends of a helper's output pipes, read as data comes and kept up to
    ``OUTPUT_KEPT`` bytes each. Closed once the helper has ended, never waiting for the
    end of the data: a process of the account may hold a copy of a write end, and what it
    writes after the close goes nowhere (where a file of the agent's would fill a disk)."""

    def __init__(self, *fds: int) -> None:
        self.kept = {fd: bytearray() for fd in fds}
        self._loop = asyncio.get_running_loop()
        for fd in fds:
            os.set_blocking(fd, False)
            self._loop.add_reader(fd, self._read, fd)

    def _read(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._loop.remove_reader(fd)
                return
            kept = self.kept[fd]
            kept += chunk[: max(0, OUTPUT_KEPT - len(kept))]

    def close(self) -> None:
        for fd in self.kept:
            self._read(fd)  # what the helper wrote before it ended
            self._loop.remove_reader(fd)
            os.close(fd)

    def text(self, fd: int) -> str:
        return bytes(self.kept[fd]).decode(errors="replace")


async def as_account(account: Account, script: str, *args: str, timeout_s: float) -> str:
    """Run the shell ``script`` (arguments ``$1``...) as ``account``, in ``/`` with only
    ``PATH`` and the account's own variables; its standard output. ``OSError`` with what it
    printed on standard error when it fails, or when it has not ended after ``timeout_s``
    (then it is killed, with whatever it started in its session): a workload of the same
    uid may stop it (SIGSTOP) or hold it on a FIFO, and the agent must go on. In a session
    of its own, so it has no terminal of the agent's to write to. Its output comes through
    pipes of the agent's own (``_Drain``): asyncio's would wait for every holder of a
    write end to close it."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    drain = _Drain(out_r, err_r)
    try:
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                script,
                "sh",
                *args,
                env={"PATH": HELPER_PATH, **account.env()},
                cwd="/",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
                user=account.uid,
                group=account.gid,
                extra_groups=list(account.groups),
            )
        finally:
            os.close(out_w)
            os.close(err_w)
        try:
            code = await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), KILLED_WAIT_S)
            raise OSError(f"not done within {timeout_s:.0f} s as {account.name}") from None
    finally:
        drain.close()
    if code != 0:
        raise OSError(drain.text(err_r).strip() or f"exit {code}")
    return drain.text(out_r)


__all__ = ["DEFAULT_MIN_UID", "Account", "account_of", "as_account", "can_switch"]
