"""The one error type of the core: bad input, naming the field and the reason."""

from __future__ import annotations


class ValidationError(ValueError):
    """Raised for bad input. ``field`` names what was wrong (a path such as
    ``children[1].shares`` or ``nlp/evals: shares``); ``reason`` says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
