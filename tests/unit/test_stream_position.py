"""``bus.stream_position`` reads a JetStream delivery's stream sequence and pending count
from its reply subject, the way nats-py's ``Msg.metadata`` does, in both subject forms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg

from allot.bus import stream_position


def _msg(reply: str) -> Msg:
    return Msg(_client=None, subject="allot.v1.events.nlp.w1.placed", reply=reply, data=b"")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("$JS.ACK.WORKLOADS.cons.1.42.7.1700000000000000000.3", (42, 3)),
        ("$JS.ACK.HOSTS.x.2.1.1.1700000000000000000.0", (1, 0)),
        # the form with a domain and an account hash (read through Msg.metadata)
        ("$JS.ACK.dom.acchash.WORKLOADS.cons.1.42.7.1700000000000000000.3.rand", (42, 3)),
        ("$JS.ACK._.acchash.USAGE.cons.5.9000.12.1700000000000000000.11.r", (9000, 11)),
    ],
)
def test_position_from_the_reply_subject(reply: str, expected: tuple[int, int]) -> None:
    assert stream_position(_msg(reply)) == expected


@given(
    seq=st.integers(1, 2**63 - 1),
    pending=st.integers(0, 2**63 - 1),
    delivered=st.integers(1, 100),
    cseq=st.integers(1, 2**40),
)
def test_the_fast_path_agrees_with_nats_py(
    seq: int, pending: int, delivered: int, cseq: int
) -> None:
    msg = _msg(
        f"$JS.ACK.WORKLOADS.placement_x.{delivered}.{seq}.{cseq}.1700000000000000000.{pending}"
    )
    meta = msg.metadata
    assert stream_position(msg) == (meta.sequence.stream, meta.num_pending)
