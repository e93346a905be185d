"""Reading the files a user names (traces, VC sizes, YAML): a file that is missing, a
folder, unreadable or not UTF-8 is a ``ValidationError`` naming its path with a one-line
reason, never a traceback."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from allot.core.errors import ValidationError

if TYPE_CHECKING:
    from _csv import Reader


def unreadable(where: str, exc: OSError | UnicodeDecodeError) -> ValidationError:
    """Why the file at ``where`` could not be read, in one line."""
    if isinstance(exc, UnicodeDecodeError):
        return ValidationError(where, f"not UTF-8 text ({exc.reason})")
    if isinstance(exc, FileNotFoundError):
        return ValidationError(where, "no such file")
    if isinstance(exc, IsADirectoryError):
        return ValidationError(where, "is a directory, not a file")
    return ValidationError(where, f"cannot read: {exc.strerror or exc}")


@contextmanager
def csv_rows(path: Path) -> Iterator[Reader]:
    """The rows of the CSV file at ``path`` (a UTF-8 byte order mark is skipped). A read
    error while the rows are being consumed is reported like one at opening."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            yield csv.reader(handle)
    except (OSError, UnicodeDecodeError) as exc:
        raise unreadable(str(path), exc) from None
