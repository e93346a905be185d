"""A submission's checkpoint protocol (issue 40): the checks every entry point runs (the SDK
and the CLI before sending, intake on receipt), each refusal naming the field. The wire
types check a signal's name and a path's shape on decode; these add what a type cannot:
the timeout against the grace period, and a path with no ``..`` in it (the agent's test
that a named directory lies inside the roots it allows compares paths as written)."""

from __future__ import annotations

import posixpath
from typing import get_args

from allot.core.errors import ValidationError
from allot.proto import messages as m

SIGNALS: tuple[str, ...] = get_args(m.CheckpointSignal)
CHECKPOINTED_FILE = ".allot-checkpointed"
"""In ``ALLOT_CHECKPOINT_DIR``: written (or touched) by a workload, or by the SDK's
``confirm_checkpoint``, once a checkpoint is complete; its modification time is the
checkpoint's time."""
NOTICE_FILE = ".allot-checkpoint-requested"
"""In ``ALLOT_CHECKPOINT_DIR``: written by the agent at a notice (its text: the SIGKILL
deadline, seconds since the Unix epoch), for workloads that poll rather than catch a
signal."""


def check_checkpoint(
    *,
    signal: str | None,
    timeout_s: float | None,
    directory: str | None,
    grace_s: float | None,
) -> None:
    """Raise ``ValidationError`` naming ``checkpoint_signal``, ``checkpoint_timeout_s`` or
    ``checkpoint_dir``. ``grace_s``: the grace period the workload's notice will give (None:
    unknown here, the CLI's case; intake knows it)."""
    if signal is not None and signal not in SIGNALS:
        raise ValidationError(
            "checkpoint_signal", f"unknown signal {signal!r}; one of {', '.join(SIGNALS)}"
        )
    if timeout_s is not None:
        if not 0 < timeout_s <= 86_400:
            raise ValidationError(
                "checkpoint_timeout_s", f"must be in (0, 86400] s, got {timeout_s}"
            )
        if grace_s is not None and timeout_s > grace_s:
            raise ValidationError(
                "checkpoint_timeout_s",
                f"{timeout_s:g} s is longer than the grace period ({grace_s:g} s) between a "
                "notice and the SIGKILL: the checkpoint could never finish",
            )
    if directory is not None:
        if not directory.startswith("/") or "\0" in directory:
            raise ValidationError("checkpoint_dir", f"{directory[:80]!r} is not an absolute path")
        if len(directory) > m.MAX_CHECKPOINT_DIR_LEN:
            raise ValidationError(
                "checkpoint_dir", f"longer than {m.MAX_CHECKPOINT_DIR_LEN} characters"
            )
        if ".." in directory.split("/") or posixpath.normpath(directory) != directory.rstrip("/"):
            raise ValidationError(
                "checkpoint_dir",
                f"{directory[:80]!r} is not a plain path (no '..', '.' or '//' in it)",
            )


def parse_signal(text: str) -> str:
    """``USR1``, ``SIGUSR1`` or ``usr1`` as the wire's name (``USR1``)."""
    name = text.strip().upper()
    return name[3:] if name.startswith("SIG") else name


__all__ = ["CHECKPOINTED_FILE", "NOTICE_FILE", "SIGNALS", "check_checkpoint", "parse_signal"]
