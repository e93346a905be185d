"""Writing the folder a user names (``--out DIR``): a path that is a regular file, under a
file, or somewhere nothing can be created (``/proc/x``, a read-only disk) is a
``ValidationError`` naming the flag with a one-line reason, never a traceback. The
counterpart of ``allot.sim.input_files`` for outputs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from allot.core.errors import ValidationError


def csv_number(value: float) -> str:
    """A number as a CSV cell that reads back the same: ``3``, ``2.5``, never ``3.0``."""
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if value.is_integer() else repr(value)


def unwritable(flag: str, exc: OSError) -> ValidationError:
    """Why the output under ``flag`` could not be written, in one line."""
    where = exc.filename if exc.filename is not None else "output"
    if isinstance(exc, FileExistsError):
        return ValidationError(flag, f"{where} is a file, not a folder")
    if isinstance(exc, NotADirectoryError):
        return ValidationError(flag, f"{where}: a folder on its path is a file")
    return ValidationError(flag, f"cannot write {where}: {exc.strerror or exc}")


def make_out_dir(path: Path, flag: str) -> None:
    """Create the folder ``path`` (and its parents) or say why it cannot be."""
    with writing_to(flag):
        path.mkdir(parents=True, exist_ok=True)


@contextmanager
def writing_to(flag: str) -> Iterator[None]:
    """Report an ``OSError`` raised inside as bad input for ``flag``. The writer may be a
    worker process: its ``OSError`` arrives here through ``Future.result``."""
    try:
        yield
    except BrokenPipeError:
        raise  # stdout's reader went away: not the folder's fault (allot.cli.main)
    except OSError as exc:
        raise unwritable(flag, exc) from None
