"""Allot's Python SDK: ``Client`` submits, cancels, queries and follows workloads over
NATS. Errors: ``allot.sdk.errors`` (a refusal is a ``ValidationError`` naming the field)."""

from allot.proto.messages import SubmitWorkload
from allot.sdk.client import DEFAULT_NATS_URL, Client, PreemptionSubscription, new_client_id
from allot.sdk.errors import (
    BadReplyError,
    CommandRejectedError,
    LoginRefusedError,
    NoResponderError,
    NotConnectedError,
    PermissionDeniedError,
    RequestTimeoutError,
    SdkError,
    SubmitRejectedError,
    UnknownWorkloadError,
)

__all__ = [
    "DEFAULT_NATS_URL",
    "BadReplyError",
    "Client",
    "CommandRejectedError",
    "LoginRefusedError",
    "NoResponderError",
    "NotConnectedError",
    "PermissionDeniedError",
    "PreemptionSubscription",
    "RequestTimeoutError",
    "SdkError",
    "SubmitRejectedError",
    "SubmitWorkload",
    "UnknownWorkloadError",
    "new_client_id",
]
