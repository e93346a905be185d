"""The checkpoint protocol on notice, as the agent runs it (issue 40; docs/decisions/0053).

A part whose submission asked for the protocol (``HostTask.checkpoint``) gets
``ALLOT_CHECKPOINT_DIR``: the directory it names (``checkpoint_dir``, which must lie inside
a root the agent allows, ``--checkpoint-allow``), or one the agent manages,
``<--checkpoint-root>/<allocation>/<workload>``, the same for every attempt. Requeued work
lands on any host, so in a real cluster both roots are on shared storage; a missing or
refused directory fails the part before it starts, its reason naming ``checkpoint_dir``.

At a notice the agent writes ``NOTICE_FILE`` in the directory, sends ``checkpoint_signal``
to the part's process group, and waits for the workload to say "checkpointed": by writing
``CHECKPOINTED_FILE`` (the SDK's ``confirm_checkpoint`` does), or by exiting 0. It sends
SIGTERM at that moment or at ``checkpoint_timeout_s`` after the notice, whichever is first
(SIGKILL at the grace deadline as always). ``outcome`` then tells, from the confirmation's
time: ``done`` within the timeout, ``late`` after it but before the kill, ``missed`` never.

A session (``kind`` ``session``) also gets ``ALLOT_SESSION_DIR``, a host-local directory:
its state is copied there from ``<checkpoint dir>/session-state`` at start (restored) and
back after a notice ends the part (saved: the copy replaces the previous one only once
whole), so an interactive process that cannot checkpoint itself survives a preemption.

Under ``--run-as-user`` the part's account (``accounts``) owns these files: a directory the
workload names is created, and the notice and a session's state are written, by shell
commands run as that account (``account_shell``); the agent (root) creates only what lies
under its own roots (the managed directory, a session's live directory) and hands it to
the account (``safe_paths``). As root it would follow links the workload planted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.proto.checkpoint_rules import CHECKPOINTED_FILE, NOTICE_FILE
from allot.proto.subjects import UNALLOCATED
from allot.services.agent.account_shell import as_account
from allot.services.agent.accounts import Account
from allot.services.agent.part_names import part_name
from allot.services.agent.safe_paths import hand_over, own_dir

SESSION_STATE = "session-state"
"""Inside the checkpoint directory: a session's saved state directory."""
SESSION_SCRATCH = Path(tempfile.gettempdir()) / "allot-sessions"
"""Host-local root of the sessions' live state directories."""

SETUP_TIMEOUT_S = 30.0
"""How long creating a part's checkpoint directory as its account may take."""
COPY_TIMEOUT_S = 300.0
"""How long copying a session's state as its account may take (restore or save)."""
MAKE_OWN_DIR = 'mkdir -p -- "$1" && test -w "$1" -a -x "$1" || { echo "not writable" >&2; exit 1; }'
"""As the account: its directory ``$1``, which it must be able to write."""
WRITE_NOTICE = (
    'if [ -L "$1" ] || { [ -e "$1" ] && [ ! -f "$1" ]; }; then echo "not a file" >&2; exit 1; fi; '
    'printf "%s\\n" "$2" > "$1"'
)
"""As the account: the notice ``$2`` into ``$1``, a regular file (not a FIFO that would
hold the helper until its timeout)."""
RESTORE = 'if [ -d "$1" ]; then cp -a -- "$1/." "$2/" && echo restored; fi'
"""As the account: the saved state ``$1`` (if any) copied into its live directory ``$2``."""
SAVE = f"""set -e
state="$2/{SESSION_STATE}"
rm -rf -- "$state.new"
cp -a -- "$1" "$state.new"
rm -rf -- "$state.old"
if [ -e "$state" ] || [ -L "$state" ]; then mv -- "$state" "$state.old"; fi
mv -- "$state.new" "$state"
rm -rf -- "$state.old"
"""
"""As the account: ``save_session``'s steps, with its live directory ``$1`` and its
checkpoint directory ``$2``."""


async def checkpoint_dir(
    task: m.HostTask, root: Path | None, allowed: tuple[Path, ...], account: Account | None
) -> Path:
    """The part's ``ALLOT_CHECKPOINT_DIR``, created (for ``account``: its own, see the
    module); ``ValidationError`` naming ``checkpoint_dir`` when the agent cannot give it."""
    if task.checkpoint_dir is not None:
        # Resolved, so a link inside an allowed root cannot lead out of it.
        named = Path(os.path.realpath(task.checkpoint_dir))
        if not any(named == r or r in named.parents for r in allowed):
            shown = ", ".join(str(r) for r in allowed) or "none: no --checkpoint-allow"
            raise ValidationError(
                "checkpoint_dir",
                f"{task.checkpoint_dir} is outside the roots this agent allows ({shown})",
            )
        path = named
    elif root is None:
        raise ValidationError(
            "checkpoint_dir",
            "this agent keeps no checkpoints (no --checkpoint-root); name a directory inside "
            "the roots it allows",
        )
    else:
        path = root / (task.allocation or UNALLOCATED) / task.workload_id
    try:
        if account is None:
            path.mkdir(parents=True, exist_ok=True)
        elif task.checkpoint_dir is not None:
            await as_account(account, MAKE_OWN_DIR, str(path), timeout_s=SETUP_TIMEOUT_S)
        else:
            assert root is not None
            own_dir(root)
            own_dir(path.parent)
            hand_over(path, account)
    except OSError as e:
        raise ValidationError(
            "checkpoint_dir", f"cannot create {path}: {e.strerror or e}"
        ) from None
    return path


def confirmed_at(directory: Path | None) -> float | None:
    """The time of the workload's last confirmed checkpoint (``CHECKPOINTED_FILE``'s mtime)."""
    if directory is None:
        return None
    try:
        # The file itself, not what a link there leads to (the agent may be root).
        return (directory / CHECKPOINTED_FILE).lstat().st_mtime
    except OSError:
        return None


async def write_notice(
    directory: Path, kill_at: float, account: Account | None, timeout_s: float
) -> None:
    """The notice file, if it can be written within ``timeout_s``: never through a link, nor
    into a FIFO, which would hold the agent (opened without blocking, refused unless a
    regular file)."""
    with contextlib.suppress(OSError):  # a full disk must not stop the stop
        if account is not None:
            if timeout_s <= 0:
                return  # the deadline has passed: the part is being killed
            path, text = str(directory / NOTICE_FILE), f"{kill_at:.3f}"
            await as_account(account, WRITE_NOTICE, path, text, timeout_s=timeout_s)
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(directory / NOTICE_FILE, flags, 0o644)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.ftruncate(fd, 0)
                os.write(fd, f"{kill_at:.3f}\n".encode())
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class Outcome:
    outcome: m.CheckpointOutcome | None
    checkpointed_at: float | None


def outcome(
    *,
    started_at: float,
    noticed_at: float | None,
    confirm_by: float | None,
    confirmed: float | None,
    exit_code: int,
    exited_at: float,
    terminated_at: float | None,
) -> Outcome:
    """What to report of an ended part. ``noticed_at``: when its notice was delivered (None:
    no notice); ``confirm_by``: the notice plus the timeout; ``confirmed``:
    ``CHECKPOINTED_FILE``'s mtime; ``terminated_at``: when the agent sent SIGTERM (None:
    never). A confirmation before the start is an older attempt's; one after the exit is
    clamped to it. An exit 0 before any SIGTERM confirms too (at the exit)."""
    last = None if confirmed is None or confirmed < started_at else min(confirmed, exited_at)
    if noticed_at is None or confirm_by is None:
        return Outcome(None, last)
    if last is not None and last >= noticed_at:
        return Outcome("done" if last <= confirm_by else "late", last)
    if exit_code == 0 and terminated_at is None and exited_at <= confirm_by:
        return Outcome("done", exited_at)
    return Outcome("missed", last)


# ---------------------------------------------------------------------- sessions
def session_dir(task: m.HostTask, host: str, root: Path | None = None) -> Path:
    """A session's live directory under ``root`` (None: ``SESSION_SCRATCH``)."""
    return (root or SESSION_SCRATCH) / part_name(task.workload_id, task.attempt, host)


async def restore_session(checkpoints: Path, live: Path, account: Account | None) -> bool:
    """Copy the saved state (if any) into a fresh ``live`` directory; True when restored."""
    saved = checkpoints / SESSION_STATE
    if account is None:
        shutil.rmtree(live, ignore_errors=True)
        if saved.is_dir():
            shutil.copytree(saved, live, symlinks=True)
            return True
        live.mkdir(parents=True)
        return False
    own_dir(live.parent)
    shutil.rmtree(live, ignore_errors=True)  # in the agent's own directory: no link followed
    hand_over(live, account)
    out = await as_account(account, RESTORE, str(saved), str(live), timeout_s=COPY_TIMEOUT_S)
    return out.strip() == "restored"


async def save_session(live: Path, checkpoints: Path, account: Account | None) -> None:
    """Copy ``live`` over the saved state: to a new directory first, renamed into place
    once whole (an interrupted copy leaves the previous state)."""
    if account is not None:
        await as_account(account, SAVE, str(live), str(checkpoints), timeout_s=COPY_TIMEOUT_S)
        return
    new = checkpoints / f"{SESSION_STATE}.new"
    old = checkpoints / f"{SESSION_STATE}.old"
    shutil.rmtree(new, ignore_errors=True)
    shutil.copytree(live, new, symlinks=True)
    saved = checkpoints / SESSION_STATE
    shutil.rmtree(old, ignore_errors=True)
    if saved.exists():
        saved.rename(old)
    new.rename(saved)
    shutil.rmtree(old, ignore_errors=True)


__all__ = [
    "Outcome",
    "checkpoint_dir",
    "confirmed_at",
    "outcome",
    "restore_session",
    "save_session",
    "session_dir",
    "write_notice",
]
