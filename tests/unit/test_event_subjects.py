"""A lifecycle event's subject names the event (``allot.v1.events.<a>.<w>.<event>``), so a
reader can have the server filter by it (accounting reads only ``CHARGED_EVENTS``). That is
safe only if every record is filed under its own name and readers refuse one that is not:
otherwise a filtered reader and an unfiltered one would fold different logs."""

from __future__ import annotations

import msgspec
import pytest

from allot import bus
from allot.core.errors import ValidationError
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s

T = 1_700_000_000.0
ONE = (m.HostGpus(host="h01", gpus=(0,)),)
RECORDS: list[msgspec.Struct] = [
    m.WorkloadSubmitted(workload_id="w1", client_id="c", user="u", gpus=1, at=T),
    m.CancelRequested(workload_id="w1", allocation="nlp", by="u", at=T),
    m.WorkloadPlaced(workload_id="w1", allocation="nlp", at=T, gpus=1, assignment=ONE),
    m.WorkloadStarted(workload_id="w1", allocation="nlp", at=T, host="h01"),
    m.WorkloadPreempted(workload_id="w1", allocation="nlp", at=T, reason="better-ranked"),
    m.WorkloadRequeued(workload_id="w1", allocation="nlp", at=T),
    m.WorkloadCompleted(workload_id="w1", allocation="nlp", at=T),
    m.WorkloadFailed(workload_id="w1", allocation="nlp", at=T),
    m.WorkloadCancelled(workload_id="w1", allocation="nlp", at=T),
]


def test_every_logged_event_has_one_name_and_every_name_one_event() -> None:
    assert sorted(m.EVENT_NAME.values()) == sorted(s.EVENT_NAMES)
    assert len(set(m.EVENT_NAME.values())) == len(m.EVENT_NAME)
    assert {type(r) for r in RECORDS} == set(m.EVENT_NAME)
    assert set(s.CHARGED_EVENTS) <= set(s.EVENT_NAMES)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_record_filed_under_its_name_reads_back(record: msgspec.Struct) -> None:
    subject = bus.event_subject("nlp", record)
    assert subject == f"allot.v1.events.nlp.w1.{m.EVENT_NAME[type(record)]}"
    assert bus.decode_record(subject, codec.encode(record)) == record


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_record_filed_under_another_name_is_refused(record: msgspec.Struct) -> None:
    for name in s.EVENT_NAMES:
        if name == m.EVENT_NAME[type(record)]:
            continue
        with pytest.raises(ValidationError) as caught:
            bus.decode_record(s.events("nlp", "w1", name), codec.encode(record))
        assert caught.value.field == "subject"
        assert name in caught.value.reason and type(record).__name__ in caught.value.reason


def test_answers_and_queue_positions_are_never_logged() -> None:
    accepted = m.WorkloadAccepted(workload_id="w1", client_id="c", at=T)
    with pytest.raises(ValidationError) as caught:
        bus.event_subject("nlp", accepted)
    assert caught.value.field == "type"
    with pytest.raises(ValidationError) as caught:  # not an event of the contract
        bus.decode_record(s.events("nlp", "w1", "placed"), codec.encode(accepted))
    assert caught.value.field == "type" and "WorkloadAccepted" in caught.value.reason


def test_the_charged_events_are_those_that_start_or_end_a_run() -> None:
    """Accounting's filter: the records its charger acts on, and none it skips."""
    from allot.services.accounting import _CHARGEABLE

    charged = {type(r).__name__ for r in RECORDS if m.EVENT_NAME[type(r)] in s.CHARGED_EVENTS}
    assert charged == {tag.strip(b'"').decode() for tag in _CHARGEABLE}
