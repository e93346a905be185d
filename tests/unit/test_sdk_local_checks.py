"""What ``allot.sdk.Client`` refuses before any I/O, naming the field (found by a user trial).

Every call is made on a client that never connected: a value that gets past the local
checks reaches the connection and raises ``NotConnectedError``, so a missing check fails
the test instead of going unnoticed (or hanging, as a NaN ``idle_timeout`` did).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.proto import subjects
from allot.sdk import Client, NotConnectedError

Call = Callable[[Client], Awaitable[Any]]


def submit(**fields: Any) -> Call:
    """``Client.submit`` of a valid unallocated workload, with ``fields`` changed."""
    return lambda c: c.submit(**{"user": "ann", "gpus": 1, **fields})


def batch(*, timeout: float | None = None, **fields: Any) -> Call:
    """``Client.submit_batch`` of one workload built as a caller builds it (msgspec checks
    nothing at construction), with ``fields`` changed."""
    item = m.SubmitWorkload(**{"client_id": "job-1", "user": "ann", "gpus": 1, **fields})
    return lambda c: c.submit_batch([item], timeout=timeout)


def watch(workload_id: str = "wl-a", allocation: str | None = "nlp", **options: Any) -> Call:
    async def follow(c: Client) -> None:
        async for _ in c.watch(workload_id, allocation, **options):
            pass

    return follow


def on_preemption(**options: Any) -> Call:
    return lambda c: c.on_preemption(lambda notice: None, **options)


REFUSED = [
    # -- command: what no host can run is refused before it is queued (and may preempt)
    pytest.param(
        submit(command="python train.py"),
        "command",
        "must be a list of strings, not one string",
        id="a command given as one string was split into characters",
    ),
    pytest.param(
        submit(command=["python", "train\x00.py"]),
        "command[1]",
        "NUL",
        id="a NUL in an argument cannot reach exec",
    ),
    pytest.param(
        submit(command=["", "train.py"]),
        "command[0]",
        "names the program",
        id="an empty program name cannot be run",
    ),
    pytest.param(
        batch(command="python train.py"),
        "workloads[0].command",
        "not one string",
        id="a batch item's command given as one string",
    ),
    pytest.param(
        batch(command=("python", "a\x00")),
        "workloads[0].command[1]",
        "NUL",
        id="a batch item's argument holding a NUL",
    ),
    pytest.param(
        batch(env={"CUDA_VISIBLE_DEVICES": "0"}),
        "workloads[0].env",
        "set by the agent",
        id="a batch item setting what the agent sets, as submit refuses it",
    ),
    pytest.param(
        lambda c: c.submit_batch([{"client_id": "job-1", "user": "ann", "gpus": 1}]),
        "workloads[0]",
        "must be a SubmitWorkload",
        id="a batch item that is a dict",
    ),
    # -- ids and scopes: NATS tokens the wire still refuses as names
    pytest.param(
        lambda c: c.status("ünï"),
        "workload_id",
        "letters, digits",
        id="status of an id the leader would reject",
    ),
    pytest.param(
        lambda c: c.status("wl-a", scope="ünï"),
        "scope",
        "letters, digits",
        id="status scoped to an allocation that cannot exist",
    ),
    pytest.param(
        lambda c: c.queue(scope="ünï"), "scope", "letters, digits", id="queue scoped to a non-name"
    ),
    pytest.param(
        lambda c: c.cancel("a.b", allocation="nlp", user="ann"),
        "workload_id",
        "letters, digits",
        id="cancel names the argument, not the subject's token",
    ),
    pytest.param(watch("ünï"), "workload_id", "letters, digits", id="watch of a non-name id"),
    pytest.param(
        watch(allocation="ünï"), "allocation", "letters, digits", id="watch under a non-name"
    ),
    pytest.param(
        on_preemption(workload_id="ünï"),
        "workload_id",
        "letters, digits",
        id="notices of a workload no service can name",
    ),
    pytest.param(
        on_preemption(workload_id="ünï", allocation="nlp"),
        "workload_id",
        "letters, digits",
        id="notices of such a workload in an allocation",
    ),
    pytest.param(
        on_preemption(allocation="ünï"),
        "allocation",
        "letters, digits",
        id="notices of an allocation no service can name",
    ),
    pytest.param(
        on_preemption(allocation="bad token"),
        "allocation",
        "whitespace",
        id="notices of an allocation with a space (the trial's case, refused already)",
    ),
    # -- waits: NaN never expires, zero or less read as a silent service
    pytest.param(
        watch(idle_timeout=math.nan), "idle_timeout", "positive", id="watch idle NaN hung forever"
    ),
    pytest.param(
        watch(idle_timeout=-1.0), "idle_timeout", "positive", id="watch idle negative timed out"
    ),
    pytest.param(watch(idle_timeout=0), "idle_timeout", "positive", id="watch idle zero"),
    pytest.param(lambda c: c.hosts(timeout=-1), "timeout", "positive", id="hosts negative timeout"),
    pytest.param(
        lambda c: c.hosts(timeout=math.nan), "timeout", "positive", id="hosts NaN timeout"
    ),
    pytest.param(
        lambda c: c.status("wl-a", timeout=0), "timeout", "positive", id="status zero timeout"
    ),
    pytest.param(
        lambda c: c.share(timeout=math.inf), "timeout", "positive", id="share infinite timeout"
    ),
    pytest.param(submit(timeout=-5), "timeout", "positive", id="submit negative timeout"),
    pytest.param(batch(timeout=math.nan), "timeout", "positive", id="batch NaN timeout"),
    pytest.param(
        lambda c: c.cancel("wl-a", allocation=None, user="ann", timeout="5"),
        "timeout",
        "number of seconds",
        id="cancel timeout given as text",
    ),
    pytest.param(
        lambda c: c.owed(window_s=math.nan),
        "window_s",
        "finite",
        id="owed NaN window was sent as null",
    ),
    pytest.param(lambda c: c.owed(window_s=-3600.0), "window_s", "> 0", id="owed negative window"),
]


@pytest.mark.parametrize(("call", "field", "reason"), REFUSED)
async def test_a_bad_argument_is_refused_before_any_io_naming_it(
    call: Call, field: str, reason: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        await call(Client())
    assert refused.value.field == field
    assert reason in refused.value.reason


ACCEPTED = [
    pytest.param(submit(command=["grep", "", "log.txt"]), id="an empty argument after the program"),
    pytest.param(submit(command=()), id="no command: fake agents run it"),
    pytest.param(batch(command=["python", "train.py"]), id="a batch item's command as a list"),
    pytest.param(lambda c: c.status("wl-a", scope=subjects.UNALLOCATED), id="status of ~"),
    pytest.param(watch(allocation=""), id="watch of unallocated work from the agent's env"),
    pytest.param(watch(idle_timeout=None, missing_after=None), id="watch waiting forever"),
    pytest.param(on_preemption(allocation=subjects.UNALLOCATED), id="notices of unallocated"),
    pytest.param(on_preemption(workload_id="wl-a", allocation=""), id="notices of a workload"),
    pytest.param(lambda c: c.hosts(timeout=0.5), id="a short timeout"),
    pytest.param(lambda c: c.owed(window_s=3600, timeout=None), id="owed of the last hour"),
]


@pytest.mark.parametrize("call", ACCEPTED)
async def test_a_good_argument_gets_past_the_local_checks(call: Call) -> None:
    with pytest.raises(NotConnectedError):
        await call(Client())


@pytest.mark.parametrize(
    ("options", "field"),
    [
        pytest.param({"timeout": math.nan}, "timeout", id="NaN request timeout"),
        pytest.param({"connect_timeout": math.inf}, "connect_timeout", id="endless connect"),
        pytest.param({"connect_timeout": -1}, "connect_timeout", id="negative connect"),
    ],
)
def test_a_client_with_an_unusable_wait_is_refused(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Client(**options)
    assert refused.value.field == field


# -- names come from the login ------------------------------------------------------------------

LOGIN_URL = "nats://alice:s3cret@127.0.0.1:4222"
"""A client logged in as ``alice`` (never connected here)."""

NOT_THE_LOGIN = [
    pytest.param(submit(user="bob"), "user", id="submit as someone else"),
    pytest.param(batch(user="bob"), "workloads[0].user", id="batch item of someone else"),
    pytest.param(lambda c: c.cancel("wl-a", allocation="nlp", user="bob"), "user", id="cancel"),
    pytest.param(
        lambda c: c.cancel("wl-a", allocation="nlp", user="bob", as_operator=True),
        "user",
        id="operator cancel",
    ),
    pytest.param(lambda c: c.drain("h01", operator="bob"), "operator", id="drain"),
    pytest.param(lambda c: c.undrain("h01", operator="bob"), "operator", id="undrain"),
    pytest.param(
        lambda c: c.set_budget(("root", "nlp"), 3, set_by="bob"), "set_by", id="budget change"
    ),
]


@pytest.mark.parametrize(("call", "field"), NOT_THE_LOGIN)
async def test_with_a_login_another_name_is_refused_naming_the_field(
    call: Call, field: str
) -> None:
    """The service would refuse it on the login's subject; the SDK says so without asking."""
    with pytest.raises(ValidationError) as refused:
        await call(Client(LOGIN_URL))
    assert (refused.value.field, refused.value.reason) == (
        field,
        "'bob' differs from the login 'alice'",
    )


def test_the_login_is_the_urls_user_or_allot_nats_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALLOT_NATS_USER", raising=False)
    assert Client(LOGIN_URL).login == "alice"
    assert Client().login is None
    monkeypatch.setenv("ALLOT_NATS_USER", "bob")
    assert Client().login == "bob"
    assert Client(LOGIN_URL).login == "alice"  # the URL is what connects


WITHOUT_A_NAME = [
    pytest.param(lambda c: c.submit(gpus=1), "user", id="submit"),
    pytest.param(lambda c: c.cancel("wl-a", allocation="nlp"), "user", id="cancel"),
    pytest.param(lambda c: c.drain("h01"), "operator", id="drain"),
    pytest.param(lambda c: c.undrain("h01"), "operator", id="undrain"),
    pytest.param(lambda c: c.set_budget(("root", "nlp"), 3), "set_by", id="budget change"),
]


@pytest.mark.parametrize(("call", "field"), WITHOUT_A_NAME)
async def test_the_name_defaults_to_the_login_and_is_required_without_one(
    call: Call, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ALLOT_NATS_USER", raising=False)
    with pytest.raises(ValidationError) as refused:
        await call(Client())
    assert refused.value.field == field and "no NATS login" in refused.value.reason
    with pytest.raises(NotConnectedError):  # past the local checks, as alice
        await call(Client(LOGIN_URL))
