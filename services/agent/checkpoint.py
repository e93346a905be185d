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
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.proto.checkpoint_rules import CHECKPOINTED_FILE, NOTICE_FILE
from allot.proto.subjects import UNALLOCATED

SESSION_STATE = "session-state"
"""Inside the checkpoint directory: a session's saved state directory."""
SESSION_SCRATCH = Path(tempfile.gettempdir()) / "allot-sessions"
"""Host-local root of the sessions' live state directories."""


def checkpoint_dir(task: m.HostTask, root: Path | None, allowed: tuple[Path, ...]) -> Path:
    """The part's ``ALLOT_CHECKPOINT_DIR``, created; ``ValidationError`` naming
    ``checkpoint_dir`` when the agent cannot give it (see the module)."""
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
        path.mkdir(parents=True, exist_ok=True)
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
        return (directory / CHECKPOINTED_FILE).stat().st_mtime
    except OSError:
        return None


def write_notice(directory: Path, kill_at: float) -> None:
    with contextlib.suppress(OSError):  # a full disk must not stop the stop
        (directory / NOTICE_FILE).write_text(f"{kill_at:.3f}\n")


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
def session_dir(task: m.HostTask, host: str) -> Path:
    return SESSION_SCRATCH / f"{task.workload_id}.{task.attempt}.{host}"


def restore_session(checkpoints: Path, live: Path) -> bool:
    """Copy the saved state (if any) into a fresh ``live`` directory; True when restored."""
    shutil.rmtree(live, ignore_errors=True)
    saved = checkpoints / SESSION_STATE
    if saved.is_dir():
        shutil.copytree(saved, live, symlinks=True)
        return True
    live.mkdir(parents=True)
    return False


def save_session(live: Path, checkpoints: Path) -> None:
    """Copy ``live`` over the saved state: to a new directory first, renamed into place
    once whole (an interrupted copy leaves the previous state)."""
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
