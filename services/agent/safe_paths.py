"""Paths the agent, as root, creates or opens for a part's account (``--run-as-user``): its
managed checkpoint directory, a session's live directory, its output file.

Root follows whatever link it meets. So every directory on the way must be one no account
can rename or replace (root's, closed to others or sticky like ``/tmp``: an entry of
root's in a sticky directory stays root's), made and checked one at a time (``own_dir``);
the last step, the account's own directory or file, is opened with ``O_NOFOLLOW`` and
taken only if it is the agent's or the account's (``hand_over``, ``open_output``). Without
an account the output file is opened the same way, minus the hand-over: a workload of the
agent's own user could still plant a FIFO there, whose open would hold the agent.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import IO

from allot.services.agent.accounts import Account

OWN_DIR_MODE = 0o755
"""Directories the agent makes on the way: the accounts pass through them, none writes."""


def _untrusted(part: Path, *, alone: bool = False) -> str | None:
    """Why the existing directory ``part`` is no safe one to pass through (None: it is), or
    with ``alone`` no directory of the agent's alone (sticky or not, closed to others);
    ``FileNotFoundError`` when it does not exist."""
    try:
        st = os.lstat(part)
    except FileNotFoundError:
        raise
    except OSError as e:
        return f"{part}: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode):
        return f"{part} is a link: name the directory it leads to"
    if not stat.S_ISDIR(st.st_mode):
        return f"{part} is not a directory"
    if st.st_uid not in ((os.geteuid(),) if alone else (0, os.geteuid())):
        return f"{part} belongs to uid {st.st_uid}, not to root"
    if st.st_mode & 0o022 and alone:
        return f"{part} may be written by others"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"{part} may be written by others (and is not sticky)"
    return None


def untrusted_root(path: Path) -> str | None:
    """Why an account could redirect the agent's work under the root ``path`` (None: none
    can). Every directory on the way that exists must pass ``_untrusted``, and ``path``
    itself, if it exists, must be the agent's alone (as ``own_dir`` will require); what is
    missing, ``own_dir`` makes."""
    if not path.is_absolute():
        return f"{path} is not an absolute path"
    for part in (*reversed(path.parents), path):
        try:
            why = _untrusted(part, alone=part == path)
        except FileNotFoundError:
            return None
        if why is not None:
            return why
    return None


def own_dir(path: Path) -> None:
    """Make the directory ``path`` and what is missing above it, each checked before the
    next is made in it, or check they are safe (``_untrusted``, and ``path`` the agent's
    alone): a directory missing at the agent's start may have been made by an account
    since. ``OSError`` naming what is not."""
    for part in (*reversed(path.parents), path):
        try:
            part.mkdir()
            os.chmod(part, OWN_DIR_MODE)  # whatever the umask
        except FileExistsError:
            pass
        why = _untrusted(part, alone=part == path)
        if why is not None:
            raise OSError(f"{path} is not this agent's own directory: {why}")


def _claim(fd: int, path: Path, account: Account) -> None:
    """Give the opened ``path`` to ``account``, if it is the agent's or the account's
    already; ``OSError`` otherwise."""
    st = os.fstat(fd)
    if st.st_uid not in (os.geteuid(), account.uid):
        raise OSError(f"{path} belongs to uid {st.st_uid}, not to {account.name}")
    os.fchown(fd, account.uid, account.gid)


def hand_over(path: Path, account: Account) -> None:
    """Make the directory ``path`` if missing (its parent passed ``own_dir``) and give it
    to ``account`` alone (0700). ``OSError`` when it is a link, not a directory, or
    another account's."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        _claim(fd, path, account)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def open_output(path: Path, account: Account | None) -> IO[bytes]:
    """A part's output file (``--output-dir``), opened to append; for ``account``, given to
    it. Refused (``OSError``) unless a regular file with one name (a second name of another
    file would be handed over with it), opened without following a link and without
    blocking (a FIFO)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(path, flags, 0o666 if account is None else 0o600)  # (the umask applies)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise OSError(f"{path} is not a file of its own (a FIFO, a device, a second name)")
        if account is not None:
            _claim(fd, path, account)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


__all__ = ["hand_over", "open_output", "own_dir", "untrusted_root"]
