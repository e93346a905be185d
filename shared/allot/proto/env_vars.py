"""A workload's own environment variables (``SubmitWorkload.env``): the checks every entry
point runs (the SDK and the CLI before sending, intake on receipt), each refusal naming the
variable at fault. The wire types (``messages.Env``) check the same names and sizes on
decode, in msgspec's words; these say which variable, and add what a type cannot: the
names the agent sets itself and the total size (a host's work list carries every part's
environment)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from allot.core.errors import ValidationError
from allot.proto import messages as m

MAX_VALUE_CHARS = m.MAX_ENV_VALUE_CHARS
MAX_NAME_CHARS = m.MAX_ENV_NAME_CHARS
MAX_ENV_BYTES = 16 * 1024
"""Names and values of one workload together (UTF-8): a host's work list carries every
part's environment in one NATS message."""
_NAME = re.compile(m.ENV_NAME_PATTERN)


def check_env(env: object, *, max_vars: int = m.MAX_ENV, field: str = "env") -> dict[str, str]:
    """``env`` as a ``dict[str, str]``, or ``ValidationError(field, ...)`` naming what is
    wrong and which variable."""
    if not isinstance(env, Mapping):
        raise ValidationError(
            field, f"must be a mapping of NAME to VALUE strings, got {type(env).__name__}"
        )
    if len(env) > max_vars:
        raise ValidationError(field, f"{len(env)} variables; at most {max_vars}")
    size = 0
    for name, value in env.items():
        if not isinstance(name, str):
            raise ValidationError(field, f"a name must be a string, got {name!r}")
        if len(name) > MAX_NAME_CHARS or not _NAME.match(name):
            raise ValidationError(
                field,
                f"{name[:40]!r} is not a variable name (letters, digits and '_', not "
                f"starting with a digit, at most {MAX_NAME_CHARS})",
            )
        if not isinstance(value, str):
            raise ValidationError(
                field, f"{name}'s value must be a string, got {type(value).__name__}"
            )
        if len(value) > MAX_VALUE_CHARS:
            raise ValidationError(
                field, f"{name}'s value is {len(value)} characters; at most {MAX_VALUE_CHARS}"
            )
        if "\x00" in value:
            raise ValidationError(field, f"{name}'s value holds a NUL character")
        size += len(name.encode()) + len(value.encode())
    if size > MAX_ENV_BYTES:
        raise ValidationError(
            field, f"{size} bytes of names and values; at most {MAX_ENV_BYTES} in all"
        )
    reserved = sorted(m.RESERVED_ENV.intersection(env))
    if reserved:
        raise ValidationError(
            field,
            f"{', '.join(reserved)}: set by the agent for every workload, not by a submission",
        )
    return dict(env)


__all__ = ["MAX_ENV_BYTES", "MAX_NAME_CHARS", "MAX_VALUE_CHARS", "check_env"]
