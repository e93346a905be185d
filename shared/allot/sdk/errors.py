"""What the SDK raises: a refusal names the field (it is a ``ValidationError``, so the CLI
prints one line and exits 2); a missing or silent service says what to start."""

from __future__ import annotations

from allot.core.errors import ValidationError


class SdkError(Exception):
    """The request could not be answered (no server, no responder, timeout, bad reply)."""


class NotConnectedError(SdkError):
    """The NATS server could not be reached."""


class LoginRefusedError(NotConnectedError):
    """The NATS server refused this user's login (wrong user or password): an answer about
    the credentials, not an outage."""


class NoResponderError(SdkError):
    """Nobody subscribes to the request subject: the service is not running."""

    def __init__(self, subject: str, who: str) -> None:
        super().__init__(f"no {who} answered {subject}: is the stack running? (allot up)")
        self.subject = subject


class RequestTimeoutError(SdkError):
    """A responder exists but no answer came in time (after the retries)."""

    def __init__(self, subject: str, who: str, timeout: float, attempts: int) -> None:
        super().__init__(
            f"{who} did not answer {subject} within {timeout:g} s "
            f"({attempts} attempt{'s' if attempts != 1 else ''})"
        )
        self.subject = subject


class PermissionDeniedError(SdkError):
    """The NATS server refused this user's publish to the request subject (a permissions
    violation): the user's role does not allow the request, whoever would answer it."""

    def __init__(self, subject: str) -> None:
        super().__init__(
            f"NATS refused {subject} for this user (permissions violation): its role does "
            "not allow it (teams: their own allocations, with --alloc, and work without "
            "one with --alloc '~'; managers: budgets and cancel --manager in their subtree; "
            "operators: drain, undrain and cancel --operator; a team follows its own "
            "workloads' records with allot watch, managers and operators read the whole "
            "log's pages: allot export, whatif, budgets history)"
        )
        self.subject = subject


class BadReplyError(SdkError):
    """The reply was not one of the messages this request expects."""


class CommandRejectedError(ValidationError):
    """A service refused a command (``CommandRejected``): ``field`` says what was wrong."""


class UnknownWorkloadError(ValidationError):
    """``Client.watch`` of a workload the log has no record of under that allocation (a
    mistyped id, or the wrong allocation), as the placement leader confirmed."""


class SubmitRejectedError(CommandRejectedError):
    """Intake refused a submission (``WorkloadRejected``)."""

    def __init__(self, field: str, reason: str, client_id: str | None) -> None:
        super().__init__(field, reason)
        self.client_id = client_id
