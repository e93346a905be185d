"""A service given a NATS login refuses a server that takes clients without one.

A deployment meant to be secured gives every client a login of ``allot auth gen``; if a
server runs a configuration without those users (``deploy/compose.cluster.yaml``'s nodes
under ``deploy/compose.secure.yaml``'s services, an edited config that lost its
``include``), every login is accepted and ignored, and so is every process that reaches
the port without one: the stack looks secured and is open. Every service (its
``run_main``) checks once, when its broker has connected, that each server of its URL
refuses a client without a login, and stops otherwise, naming the cause.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import nats

from allot.auth.client import client_tls, masked_url
from allot.bus import server_urls

CHECK_TIMEOUT_S = 2.0
"""How long the check waits for one server; a server that does not answer in that time is
not judged (the service's own connection, which reached the cluster, goes on)."""


class OpenServerError(RuntimeError):
    """A NATS server takes clients without a login, and this client was given one."""


def addresses(url: str) -> list[tuple[str, str]]:
    """Each server address of ``url`` as the services take it (``allot.bus.server_urls``; a
    bare ``host:port`` is ``nats://``) with, beside it, the same address without any user,
    password or token."""
    out = []
    for address in server_urls(url):
        pieces = urlsplit(address if "://" in address else "nats://" + address)
        anonymous = urlunsplit(pieces._replace(netloc=pieces.netloc.rpartition("@")[2]))
        out.append((pieces.geturl(), anonymous))
    return out


async def refuse_an_open_server(url: str, name: str) -> None:
    """Raise ``OpenServerError`` when an address of ``url`` carries a login and its server
    lets a client in without one; return otherwise."""
    for address, anonymous in addresses(url):
        if address != anonymous and await _lets_in(anonymous, url, name):
            raise OpenServerError(
                f"the NATS server at {masked_url(anonymous)} lets clients in without a "
                f"login, yet {name} was given one: this deployment is not secured (that "
                "server's configuration lacks the users of `allot auth gen`; "
                "deploy/compose.cluster.yaml does not combine with deploy/compose.secure.yaml). "
                "Refusing to run on it."
            )


async def _lets_in(anonymous: str, url: str, name: str) -> bool:
    async def quiet(_: Exception) -> None:
        return None  # an expected refusal is not worth a line in the log

    try:
        nc = await asyncio.wait_for(
            nats.connect(
                [anonymous],
                name=f"{name}-login-check",
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=CHECK_TIMEOUT_S,
                tls=client_tls(url),
                error_cb=quiet,
            ),
            CHECK_TIMEOUT_S,
        )
    except Exception:  # refused (the authorization violation), or no answer in time
        return False
    await nc.close()
    return True
