"""``allot.sdk.client.check_notice``: a preemption notice is for the workload of the subject
it came on, and inside that workload for its attempt. The leader writes each notice so;
anything else is an old record replayed onto another subject (a login that may use the
JetStream API can do it: docs/security.md), and the SDK skips it."""

from __future__ import annotations

import pytest

from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.sdk.client import check_notice


def _notice(
    workload: str = "w1", allocation: str | None = "nlp", attempt: int = 2
) -> m.PreemptionNotice:
    return m.PreemptionNotice(
        workload_id=workload,
        allocation=allocation,
        at=100.0,
        reason="fairshare",
        grace_deadline=130.0,
        requeue=True,
        gpus=8,
        attempt=attempt,
    )


INSIDE = {"ALLOT_WORKLOAD_ID": "w1", "ALLOT_ATTEMPT": "2"}


@pytest.mark.parametrize(
    ("notice", "subject", "environ"),
    [
        (_notice(), "allot.v1.preempt.nlp.w1", {}),
        (_notice(), "allot.v1.preempt.nlp.w1", INSIDE),
        (_notice(allocation=None), "allot.v1.preempt.~.w1", INSIDE),
        (_notice(attempt=1), "allot.v1.preempt.nlp.w1", {}),  # outside the run: any attempt
        (
            _notice(attempt=1),
            "allot.v1.preempt.nlp.w1",
            {"ALLOT_WORKLOAD_ID": "w9", "ALLOT_ATTEMPT": "2"},
        ),
    ],
)
def test_a_notice_for_its_subjects_workload_passes(
    notice: m.PreemptionNotice, subject: str, environ: dict[str, str]
) -> None:
    check_notice(notice, subject, environ)


@pytest.mark.parametrize(
    ("notice", "subject", "environ", "field"),
    [
        (_notice(workload="w2"), "allot.v1.preempt.nlp.w1", {}, "workload_id"),
        (_notice(allocation="vision"), "allot.v1.preempt.nlp.w1", {}, "allocation"),
        (_notice(allocation=None), "allot.v1.preempt.nlp.w1", {}, "allocation"),
        (_notice(attempt=1), "allot.v1.preempt.nlp.w1", INSIDE, "attempt"),  # an earlier run's
    ],
)
def test_a_notice_replayed_onto_another_subject_or_run_is_refused_naming_the_field(
    notice: m.PreemptionNotice, subject: str, environ: dict[str, str], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        check_notice(notice, subject, environ)
    assert caught.value.field == field
