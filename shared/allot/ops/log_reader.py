"""Reading the log once, to its end, from the command line (``allot export``, ``allot
whatif``, ``allot budgets history``): the streams are replayed as the services replay them
(``allot.bus.LogFollower``: HOSTS, the budget tree, WORKLOADS; each to the end it had when
read), handed to a callback one record at a time, and the connection closed.

Two ways, the first that answers (decisions 0054 and 0080, ``docs/decisions/``):

1. *Pages from the ranking service* (``allot.v1.query.history``: ``Client.history_page``),
   which reads the log with the services' credentials. This is how operators and managers read
   it under ``allot auth gen``'s logins, which have no JetStream API (``docs/security.md``:
   whoever may create a consumer may make the server publish the log onto any subject).
   A submission's record comes without its ``command`` and ``env``; nothing here needs them.
   The query reads one filter a page: USAGE's budget trees, idle records or rankings
   (``PAGED_USAGE``); several of them are read one after another and handed over merged
   in the stream's order, as one consumer with several filters would.
2. *Ordered consumers* (the JetStream API), when no ranking service answers (no
   responders: a stack run without one): the services' credentials, or no logins at all.
   Under logins NATS refuses anyone else's JetStream request, which arrives as no answer
   and is raised as ``LogUnreadableError`` saying so.

``via`` forces one (``"query"``, ``"jetstream"``); a login the server refuses the query
(a team) gets ``allot.sdk.PermissionDeniedError``, with no fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Literal

import msgspec
import nats.errors
from nats.js.errors import NotFoundError

from allot import bus
from allot.bus.history_pages import FILTERS, IDLE_FILTER, RANKINGS_FILTER, page_records
from allot.proto import subjects as s
from allot.sdk import Client, CommandRejectedError, NoResponderError

WHOLE_LOG: tuple[str, ...] = ("HOSTS", "USAGE", "WORKLOADS")
"""What a history needs, in the order the services replay it."""
BUDGET_TREES: dict[str, str | tuple[str, ...]] = {"USAGE": s.BUDGET_TREE}
"""USAGE's filter: the budget trees, not the rankings."""
PAGED_USAGE: dict[str, dict[str, bool]] = {
    FILTERS["USAGE"]: {},
    IDLE_FILTER: {"idle": True},
    RANKINGS_FILTER: {"rankings": True},
}
"""USAGE's filters the history query serves (as the answering service reads them), each
with its query's flag."""
PAGE_RECORDS = 1000
"""Records asked for per history page (the service may send fewer: its byte bound)."""


class LogUnreadableError(RuntimeError):
    """The log could not be read (no such stream, or JetStream did not answer)."""


async def read_log(
    url: str,
    on_record: Callable[[msgspec.Struct], None],
    *,
    streams: Sequence[str] = WHOLE_LOG,
    subjects: Mapping[str, str | tuple[str, ...]] = BUDGET_TREES,
    timeout: float = 5.0,
    via: Literal["auto", "query", "jetstream"] = "auto",
) -> None:
    """Hand every record of ``streams`` (``subjects``: a filter per stream) to
    ``on_record``, in replay order; returns once each stream is read to its end. The SDK's
    connection errors (``allot.sdk.SdkError``) pass through. ``via``: see the module
    docstring (the query serves every record of WORKLOADS and HOSTS and ``PAGED_USAGE``'s
    filters of USAGE)."""
    queries = history_queries(streams, subjects)
    if via == "query" and queries is None:
        raise LogUnreadableError(
            "the history query reads all of WORKLOADS and HOSTS, and USAGE's budget trees, "
            "idle records and rankings"
        )
    async with Client(url, name="allot-cli-log", timeout=timeout, retries=0) as client:
        paged = via != "jetstream" and queries is not None
        if paged and await read_pages(
            client, on_record, streams, probe=via == "auto", subjects=subjects
        ):
            return
        await _read_consumers(client, on_record, streams, subjects, timeout)


def history_queries(
    streams: Sequence[str], subjects: Mapping[str, str | tuple[str, ...]]
) -> dict[str, list[dict[str, bool]]] | None:
    """Per stream, the history queries' flags that read what ``subjects`` filters (one
    query a filter); None when the query serves no such filter (all of USAGE, a filtered
    WORKLOADS)."""
    out: dict[str, list[dict[str, bool]]] = {}
    for stream in streams:
        wanted = subjects.get(stream, ">")
        filters = (wanted,) if isinstance(wanted, str) else tuple(wanted)
        if stream != "USAGE":
            if filters != (">",):
                return None
            out[stream] = [{}]
        elif filters and all(f in PAGED_USAGE for f in filters):
            out[stream] = [PAGED_USAGE[f] for f in filters]
        else:
            return None
    return out


async def read_pages(
    client: Client,
    on_record: Callable[[msgspec.Struct], None],
    streams: Sequence[str],
    *,
    probe: bool = False,
    subjects: Mapping[str, str | tuple[str, ...]] = BUDGET_TREES,
) -> bool:
    """Read ``streams`` page by page through ``allot.v1.query.history``; False (nothing
    read) when ``probe`` and no service answers the first page. Each stream (each filter of
    one) is read to the last sequence its first page reported; a record that does not
    decode is skipped, as ``LogFollower`` skips it. Several filters of one stream are read
    one after another and handed over in the stream's order."""
    queries = history_queries(streams, subjects)
    if queries is None:
        raise LogUnreadableError(f"the history query serves no filter of {dict(subjects)}")
    first = True
    for stream in streams:
        flavours = queries[stream]
        merged: list[tuple[int, msgspec.Struct]] = []
        take = partial(_hand_over, on_record) if len(flavours) == 1 else partial(_keep, merged)
        end_seq: int | None = None  # one cut: every filter read to the first one's end
        for flags in flavours:
            end_seq = await _read_stream(
                client, stream, flags, take, probe=probe and first, end_seq=end_seq
            )
            if end_seq is None:
                return False
            first = False
        merged.sort(key=lambda sr: sr[0])  # sequences are unique within a stream
        for _seq, record in merged:
            on_record(record)
    return True


def _hand_over(
    on_record: Callable[[msgspec.Struct], None], _seq: int, record: msgspec.Struct
) -> None:
    on_record(record)


def _keep(into: list[tuple[int, msgspec.Struct]], seq: int, record: msgspec.Struct) -> None:
    into.append((seq, record))


async def _read_stream(
    client: Client,
    stream: str,
    flags: Mapping[str, bool],
    take: Callable[[int, msgspec.Struct], None],
    *,
    probe: bool,
    end_seq: int | None = None,
) -> int | None:
    """One stream on one filter, page by page, to ``end_seq`` (None: the end its first page
    reported); that end, or None when ``probe`` and no service answers the first page."""
    start = 1
    asked = False
    while True:
        try:
            page = await client.history_page(
                stream,
                start_seq=start,
                limit=PAGE_RECORDS,
                idle=flags.get("idle", False),
                rankings=flags.get("rankings", False),
            )
        except NoResponderError as e:
            if probe and not asked:
                return None
            raise LogUnreadableError(str(e)) from e
        except CommandRejectedError as e:
            raise LogUnreadableError(f"the history query was refused: {e}") from e
        asked = True
        if end_seq is None:
            end_seq = page.last_seq
        for seq, _subject, record in page_records(page):
            if seq > end_seq:
                break
            take(seq, record)
        if page.end or page.next_seq > end_seq:
            return end_seq
        if page.next_seq <= start:
            raise LogUnreadableError(
                f"the history of {stream} did not move past sequence {start}: try again"
            )
        start = page.next_seq


async def _read_consumers(
    client: Client,
    on_record: Callable[[msgspec.Struct], None],
    streams: Sequence[str],
    subjects: Mapping[str, str | tuple[str, ...]],
    timeout: float,
) -> None:
    def take(_subject: str, record: msgspec.Struct) -> None:
        on_record(record)

    js = client.nc.jetstream(timeout=timeout)
    follower = bus.LogFollower(js, take, streams=tuple(streams), subjects=dict(subjects))
    try:
        await follower.start()
    except NotFoundError as e:
        raise LogUnreadableError(
            f"the server holds no Allot log (a stream of {', '.join(streams)} is missing): "
            "has a stack run against it?"
        ) from e
    except (TimeoutError, nats.errors.NoRespondersError) as e:
        raise LogUnreadableError(
            f"no ranking service answers {s.QUERY_HISTORY}, and JetStream did not answer "
            f"within {timeout:g} s. Under allot auth gen's logins only the services may "
            "read the log directly (docs/security.md): start the stack's ranking service, use the "
            "services' credentials, or a folder allot export wrote"
        ) from e
    finally:
        await follower.stop()
