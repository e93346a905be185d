"""Reading the log once, to its end, from the command line (``allot export``, ``allot
whatif``, ``allot budgets history``): the streams are replayed as the services replay them
(``allot.bus.LogFollower``: HOSTS, the budget tree, WORKLOADS; each to the end it had when
read), handed to a callback one record at a time, and the connection closed.

Reading uses the JetStream API (ordered consumers). ``allot auth gen`` grants that API to
the services alone (``docs/security.md``: whoever may create a consumer may make the server
publish the log onto any subject, and a JetStream request's reply subject is the asker's
choice too). Under logins these commands therefore need the services' credentials, or a
folder ``allot export`` wrote; NATS refuses anyone else's request, which arrives here as
no answer and is raised as ``LogUnreadableError`` saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import msgspec
import nats.errors
from nats.js.errors import NotFoundError

from allot import bus
from allot.proto import subjects as s
from allot.sdk import Client

WHOLE_LOG: tuple[str, ...] = ("HOSTS", "USAGE", "WORKLOADS")
"""What a history needs, in the order the services replay it."""
BUDGET_TREES: dict[str, str | tuple[str, ...]] = {"USAGE": s.BUDGET_TREE}
"""USAGE's filter: the budget trees, not the rankings."""


class LogUnreadableError(RuntimeError):
    """The log could not be read (no such stream, or JetStream did not answer)."""


async def read_log(
    url: str,
    on_record: Callable[[msgspec.Struct], None],
    *,
    streams: Sequence[str] = WHOLE_LOG,
    subjects: Mapping[str, str | tuple[str, ...]] = BUDGET_TREES,
    timeout: float = 5.0,
) -> None:
    """Hand every record of ``streams`` (``subjects``: a filter per stream) to
    ``on_record``, in replay order; returns once each stream is read to its end. The SDK's
    connection errors (``allot.sdk.SdkError``) pass through."""

    def take(_subject: str, record: msgspec.Struct) -> None:
        on_record(record)

    async with Client(url, name="allot-cli-log", timeout=timeout, retries=0) as client:
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
                f"JetStream did not answer within {timeout:g} s. Under allot auth gen's "
                "logins only the services may read the log (docs/security.md): use the "
                "services' credentials, or a folder allot export wrote"
            ) from e
        finally:
            await follower.stop()
