"""Copies of the log's own records stored again, refused by every reader (decision 0085).

Whoever may create a consumer or ask for a record chooses where the server delivers it: a
pull request's reply subject, a direct get's, is checked against no permission, and one
that is a stream's own subject stores the copy anew (decision 0079). A compromised service
(every service may read the log) could so make an earlier budget tree current again, mark
a drained host healthy with its earlier ``HostHealthy``, or raise an earlier idle flag.

A copy keeps its original's subject, whatever stream holds the reply subject it was
delivered onto: a record read from a stream that does not capture its subject
(``subjects.stream_holds``) is a copy from another stream, refused at once (each stream
dedupes only its own records). Into its own stream, a copy keeps its original's headers:
within the streams' duplicate window the stream drops it by its ``Nats-Msg-Id``. Past the
window it is stored, later than its original by more than that window, and the records of
HOSTS and USAGE carry the time they were written at (``at``; an idle flag its
``recorded_at``): such a record stored more than ``REPLAY_AFTER_S`` after it is a copy,
and is skipped wherever the log is read (the followers, the history pages, a service's
look at the last record of a subject). Live, a copy also reaches the core subscribers of
its subject as a JetStream delivery (``$JS.ACK.`` reply, ``Nats-Stream`` header), which
no writer's own publication is: those are skipped too (``jetstream_delivery``).

WORKLOADS is not judged so: its records may carry an earlier time on purpose (a run's end
reported late), and its folds already ignore a record they have applied (the attempt, the
epoch, the msg id)."""

from __future__ import annotations

from datetime import datetime

import msgspec
from nats.aio.msg import Msg

from allot.bus.streams import DUPLICATE_WINDOW_S
from allot.proto import messages as m
from allot.proto.subjects import stream_holds

REPLAY_AFTER_S = DUPLICATE_WINDOW_S
"""A stamped record stored later than this after its own ``at`` is a copy: a copy stored
sooner is dropped by the stream as a duplicate of its original (same msg id). A writer
whose clock runs this far behind nats-server's would have its records refused too: the
warning says so."""

STAMPED = (
    m.HostRegistered,
    m.HostDraining,
    m.HostDrained,
    m.HostHealthy,
    m.BudgetTreeSet,
    m.RankingUpdated,
    m.WorkloadFlaggedIdle,
    m.WorkloadIdleCleared,
    m.HostUtilizationRecorded,
)
"""The records of HOSTS and USAGE: each is stored as it is written, at its ``at``."""

EARLIER_AT_S: dict[type[msgspec.Struct], float] = {m.WorkloadFlaggedIdle: 300.0}
"""Records whose ``at`` may be earlier than their writing by this much more: an idle flag's
is the time of the agent's report that raised it, which health takes up to
``idle_watch.MAX_REPORT_AGE_S`` old (a test holds the two equal: the bus may not import
the event log). Only for flags written before they carried ``recorded_at`` (the time health
wrote them, which the rule then reads instead, with no allowance)."""

_ACK_V1_TOKENS = 9
_NS = 1e-9


def stored_at(msg: Msg) -> float | None:
    """When a JetStream delivery was stored (unix seconds, from its ``$JS.ACK`` reply);
    None for a message that is no delivery."""
    reply = msg.reply
    if not reply or not reply.startswith("$JS.ACK."):
        return None
    tokens = reply.split(".")
    if len(tokens) == _ACK_V1_TOKENS:
        return int(tokens[7]) * _NS
    return msg.metadata.timestamp.timestamp()


def replayed(
    record: msgspec.Struct,
    stored: float | datetime | None,
    stream: str | None = None,
    subject: str | None = None,
) -> str | None:
    """Why ``record``, stored at ``stored`` (in ``stream`` on ``subject``, when known), is
    a copy of a record stored elsewhere or earlier (None: it is not, or nothing says)."""
    if stream is not None and subject is not None and not stream_holds(stream, subject):
        return (
            f"{stream} does not capture {subject}: a record of another stream delivered "
            "into it (a copy)"
        )
    if stored is None or not isinstance(record, STAMPED):
        return None
    when = stored.timestamp() if isinstance(stored, datetime) else stored
    written = getattr(record, "recorded_at", None)
    if written is not None:  # an idle flag of this version: when health wrote it
        late = when - written
    else:
        late = when - record.at - EARLIER_AT_S.get(type(record), 0.0)
    if late <= REPLAY_AFTER_S:
        return None
    return (
        f"stored {late:.0f} s after its own time (more than the {REPLAY_AFTER_S:g} s "
        "duplicate window): a copy of an earlier record stored again, or its writer's clock "
        "is that far behind nats-server's"
    )


def jetstream_delivery(msg: Msg) -> bool:
    """Whether a message on a stream's subject came from the stream (a copy delivered
    there: a consumer's, a direct get's) rather than from the writer that published it."""
    if msg.reply and msg.reply.startswith("$JS.ACK."):
        return True
    return bool(msg.headers) and "Nats-Stream" in msg.headers  # type: ignore[operator]


__all__ = [
    "EARLIER_AT_S",
    "REPLAY_AFTER_S",
    "STAMPED",
    "jetstream_delivery",
    "replayed",
    "stored_at",
]
