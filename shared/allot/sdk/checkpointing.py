"""Inside a workload: the checkpoint protocol's side of the SDK (issue 40).

The agent gives a workload that asked for the protocol ``ALLOT_CHECKPOINT_DIR`` (the same
directory on every attempt) and ``ALLOT_ATTEMPT``; at a notice it writes a notice file
there and sends the workload's ``checkpoint_signal``, then waits for the workload to
confirm (``confirm_checkpoint``) before SIGTERM. ``Client.on_preemption(...,
checkpoint=fn)`` hears the same notice over NATS and calls ``fn(notice)``, then confirms.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.proto.checkpoint_rules import CHECKPOINTED_FILE, NOTICE_FILE

CheckpointFn = Callable[[m.PreemptionNotice], Any]


def checkpoint_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """``ALLOT_CHECKPOINT_DIR`` (None outside a workload under the protocol)."""
    value = (os.environ if environ is None else environ).get("ALLOT_CHECKPOINT_DIR")
    return Path(value) if value else None


def attempt(environ: Mapping[str, str] | None = None) -> int:
    """``ALLOT_ATTEMPT``: 1 for the first run, n + 1 after n preemptions (1 outside one)."""
    return int((os.environ if environ is None else environ).get("ALLOT_ATTEMPT", "1"))


def notice_requested(directory: Path | None = None) -> bool:
    """Whether the agent has written this attempt's notice file (for loops that poll)."""
    where = directory or checkpoint_dir()
    return where is not None and (where / NOTICE_FILE).exists()


def confirm_checkpoint(directory: Path | None = None) -> Path:
    """Tell the agent the checkpoint is complete (writes ``CHECKPOINTED_FILE``, now);
    ``ValidationError`` naming ``checkpoint_dir`` outside a workload under the protocol."""
    where = directory or checkpoint_dir()
    if where is None:
        raise ValidationError("checkpoint_dir", "ALLOT_CHECKPOINT_DIR is not set")
    marker = where / CHECKPOINTED_FILE
    marker.write_text(f"{os.getpid()}\n")
    return marker


def confirming(callback: Callable[[m.PreemptionNotice], Any], fn: CheckpointFn) -> CheckpointFn:
    """A notice callback that calls ``callback``, then ``fn`` (sync or async), then
    ``confirm_checkpoint``: a checkpoint that raises is not confirmed."""

    async def on_notice(notice: m.PreemptionNotice) -> None:
        for step in (callback, fn):
            result = step(notice)
            if inspect.isawaitable(result):
                await result
        confirm_checkpoint()

    return on_notice


__all__ = ["attempt", "checkpoint_dir", "confirm_checkpoint", "confirming", "notice_requested"]
