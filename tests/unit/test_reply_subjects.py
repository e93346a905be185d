"""A service answers only on an inbox: the reply subject is the sender's choice, and an
answer published elsewhere (a stream's subject, another team's watch, the JetStream API)
would carry the service's rights."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from allot.bus import inbox_replies_only, reply_allowed
from allot.core.errors import ValidationError
from allot.proto import codec
from allot.proto.subjects import Kind


@pytest.mark.parametrize(
    ("reply", "allowed"),
    [
        ("", True),  # no answer wanted (a heartbeat, a fire-and-forget publish)
        (None, True),
        ("_INBOX.abc.1", True),
        ("_INBOX_nlp.abc.1", True),
        ("allot.v1.budget.tree", False),
        ("$JS.API.STREAM.PURGE.WORKLOADS", False),
        ("allot.v1.watched.vision.t", False),
        ("_INBOXfoo", False),
        ("x._INBOX.abc", False),
    ],
)
def test_only_inboxes_are_answered(reply: str | None, allowed: bool) -> None:
    assert reply_allowed(reply) is allowed


async def test_a_raw_handler_never_sees_a_request_that_steers_its_answer() -> None:
    seen: list[str] = []

    async def handler(msg: Msg) -> None:
        seen.append(msg.reply)

    guarded = inbox_replies_only(handler)
    for reply in ("_INBOX.a.1", "allot.v1.budget.tree", "", "$JS.API.INFO"):
        await guarded(Msg(None, subject="allot.v1.query.owed", reply=reply, data=b"{}"))  # type: ignore[arg-type]
    assert seen == ["_INBOX.a.1", ""]


@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        (
            Kind.WATCH,
            b'{"type":"WatchLog","workload_id":"w","records":"events","deliver":"t",'
            b'"start_seq":18446744073709551616}',
            "start_seq",
        ),
        (
            Kind.HOST_REPORT,
            b'{"type":"PartReport","host":"h","workload_id":"w","attempt":1,'
            b'"event":"started","at":1.0,"pid":1180591620717411303424}',
            "pid",
        ),
    ],
)
def test_numbers_the_server_or_the_host_cannot_hold_are_refused_naming_them(
    kind: Kind, body: bytes, field: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        codec.decode(kind, body)
    assert refused.value.field == field
