"""A recorded history: the log's records as JSON lines (``allot twin --save FILE``, ``allot
twin --from FILE``), so a live history can be kept with a measurement and replayed where no
server runs.

One line per record, its wire JSON (the ``type`` field names it), in the order the log was
read (``allot.ops.log_reader``: HOSTS, then USAGE's budget trees, rankings and idle flags,
then WORKLOADS; each stream in its own order). Only what the twin replay reads is kept
(``RECORD_TYPES``): runs' starts and usage records are left out. No I/O: the caller
reads and writes the bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Union

import msgspec

from allot.core.errors import ValidationError
from allot.eventlog.twin import HOSTS_RECORDS, USAGE_RECORDS, WORKLOADS_RECORDS

RECORD_TYPES: tuple[type[msgspec.Struct], ...] = (
    *HOSTS_RECORDS,
    *USAGE_RECORDS,
    *WORKLOADS_RECORDS,
)
_ENCODER = msgspec.json.Encoder()
_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(Union[RECORD_TYPES])  # noqa: UP007 - a runtime tuple


def encode_records(records: Iterable[msgspec.Struct]) -> bytes:
    """The lines of ``records`` that a replay reads, in their order."""
    return b"".join(_ENCODER.encode(r) + b"\n" for r in records if isinstance(r, RECORD_TYPES))


def decode_records(data: bytes, source: str) -> list[msgspec.Struct]:
    """The records of ``data`` (lines as ``encode_records`` writes them; blank lines are
    skipped); a line that is not one raises ``ValidationError(source, "line N: why")``."""
    records = []
    for n, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(_DECODER.decode(line))
        except msgspec.DecodeError as exc:
            raise ValidationError(source, f"line {n}: {exc}") from None
    return records
