"""A client given a NATS login refuses a server that takes clients without one.

A deployment meant to be secured gives every client a login of ``allot auth gen``; if its
server runs a configuration without those users (``deploy/compose.cluster.yaml``'s nodes
under ``deploy/compose.secure.yaml``'s services, an edited config that lost its
``include``), every login is accepted and ignored, and so is every process that reaches
the port without one: the stack looks secured and is open. A service that connects with a
login (``allot.bus.connect``) checks once that a client without one is refused, and stops
otherwise, naming the cause.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import nats

from allot.auth.client import client_tls, masked_url

CHECK_TIMEOUT_S = 2.0
"""How long the anonymous check waits to connect; a server that does not answer in that
time is left to the service's own connection to report."""


class OpenServerError(RuntimeError):
    """The NATS server takes clients without a login, and this client was given one."""


def without_logins(url: str) -> list[str]:
    """Each server address of ``url`` with any user, password or token removed."""
    out = []
    for part in url.split(","):
        pieces = urlsplit(part.strip())
        out.append(urlunsplit(pieces._replace(netloc=pieces.netloc.rpartition("@")[2])))
    return out


async def refuse_an_open_server(url: str, name: str) -> None:
    """Raise ``OpenServerError`` when ``url`` carries a login and one of its servers lets a
    client in without it; return otherwise (no login given, or the anonymous client was
    refused or could not connect)."""
    anonymous = without_logins(url)
    if anonymous == [u.strip() for u in url.split(",")]:
        return  # no login given: nothing to check

    async def quiet(_: Exception) -> None:
        return None  # an expected refusal is not worth a line in the log

    try:
        nc = await nats.connect(
            anonymous,
            name=f"{name}-login-check",
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=CHECK_TIMEOUT_S,
            tls=client_tls(url),
            error_cb=quiet,
        )
    except Exception:  # refused, or unreachable: the service's own connection says which
        return
    await nc.close()
    raise OpenServerError(
        f"the NATS server at {masked_url(','.join(anonymous))} lets clients in without a "
        f"login, yet {name} was given one: this deployment is not secured (its NATS "
        "configuration lacks the users of `allot auth gen`; deploy/compose.cluster.yaml "
        "does not combine with deploy/compose.secure.yaml). Refusing to run on it."
    )
