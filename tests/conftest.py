"""Real servers for integration tests: the ones this machine runs on 127.0.0.1:4222 (NATS)
and :6379 (Redis) when they answer, embedded ones from the wheels otherwise (a fresh
machine has neither). Never a mock."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from allot.adapters.embedded import EmbeddedRedis


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if _answers(6379):
        yield "redis://127.0.0.1:6379"
        return
    with EmbeddedRedis() as server:
        yield server.url
