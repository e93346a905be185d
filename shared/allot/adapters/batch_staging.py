"""Atomic batches staged in memory for an embedded nats-server's one-replica streams.

nats-server (2.12 to 2.15 at least) stages each atomic batch sent to a one-replica file
stream in a file store of its own, under
``<store>/jetstream/<account>/streams/<stream>/batches/<hash>``: a directory made, two meta
files written with ``O_SYNC``, two directory fsyncs, the staged block fsynced at commit,
then the whole directory removed (``strace`` of one 5-record commit). A replicated stream
stages in memory instead. The staging store is never the durable copy: at commit nats-server
writes the records to the stream's own message block and, with ``sync_interval: always``,
fsyncs that block before it answers the publisher (the same ``strace``, with the staging
directory on tmpfs: the stream's block is still fsynced before the answer).

So the ``batches`` directory of the streams named here is made a symlink to a directory on
tmpfs (``/dev/shm``). A crash then loses only batches that were not committed, which no
publisher was told were stored; ``allot.bus.group_commit`` sends such a batch's records
again one by one, deduplicated by their msg ids. Nothing a disk would have kept is lost
either: a staged batch never outlived a restart on disk (below). A commit then answers
sooner; a single append is unchanged (docs/decisions/0014).

nats-server deletes a stream's ``batches`` directory (link or not) when it restores the
stream at start, so ``stage_in_memory`` is called twice per start: before (for a stream
not created yet, its directory is made with the link in it, which nats-server keeps when
the stream is created) and once the server is healthy (for a restored stream). It never
moves a directory that holds a batch being staged: such a stream keeps staging on disk,
as without this module, and ``stage_in_memory`` does not return it. On a system without
``/dev/shm`` nothing changes. The layout is nats-server's, not a documented interface: if
a version stages elsewhere, the link is simply unused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "DEFAULT_ACCOUNT",
    "MEMORY_ROOT",
    "memory_root",
    "remove_root",
    "stage_in_memory",
    "staging_dir",
]

DEFAULT_ACCOUNT = "$G"
"""nats-server's global account: where streams live when no ``accounts`` are configured."""
MEMORY_ROOT = Path("/dev/shm")


def memory_root(parent: Path = MEMORY_ROOT) -> Path | None:
    """A new private directory on tmpfs for one server's staging, or None if there is no
    such filesystem here (the caller then leaves staging where nats-server puts it)."""
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        return None
    return Path(tempfile.mkdtemp(prefix="allot-batches-", dir=parent))


def staging_dir(store: Path, account: str, stream: str) -> Path:
    """Where nats-server stages ``stream``'s atomic batches (``store`` as given by ``-sd``)."""
    return store / "jetstream" / account / "streams" / stream / "batches"


def stage_in_memory(store: Path, streams: Iterable[str], root: Path) -> list[str]:
    """Point the staging directory of each of ``streams`` (``"ACCOUNT/STREAM"``, or
    ``"STREAM"`` in the global account) at a directory under ``root``; idempotent. Returns
    the streams whose batches now stage under ``root``."""
    placed: list[str] = []
    for name in streams:
        account, _, stream = name.rpartition("/")
        account = account or DEFAULT_ACCOUNT
        link = staging_dir(store, account, stream)
        target = root / account / stream
        target.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            if Path(os.readlink(link)) == target:
                placed.append(name)
                continue
            link.unlink()  # left by an earlier run, pointing at its own (gone) directory
        elif link.is_dir():
            try:
                link.rmdir()
            except OSError:  # a batch is being staged in it: leave it on disk
                continue
        link.parent.mkdir(parents=True, exist_ok=True)
        try:
            link.symlink_to(target, target_is_directory=True)
        except FileExistsError:  # nats-server made the directory meanwhile
            continue
        placed.append(name)
    return placed


def remove_root(root: Path | None) -> None:
    """Remove a directory made by ``memory_root`` (what is left in it: batches never
    committed)."""
    if root is not None:
        with contextlib.suppress(OSError):
            shutil.rmtree(root)
