"""How a client reaches NATS: its server URL (with credentials from the environment), TLS,
its login and its own inbox prefix; and Redis, with its password. Used by every client
(services, SDK, CLI); the server side (users, permissions, the generated config) is
``allot.ops.auth_gen``."""

from __future__ import annotations

import argparse
import os
import ssl
from collections.abc import Mapping
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from allot.core.errors import ValidationError


def inbox_prefix(user: str) -> str:
    """The only inbox a (non-service) user may read: ``_INBOX_<user>``."""
    return f"_INBOX_{user}"


CA_ENV = "ALLOT_NATS_CA"
"""A CA file (PEM) that clients trust for ``tls://`` servers (``allot up --secure`` sets it)."""


def client_tls(url: str) -> ssl.SSLContext | None:
    """The SSL context for connecting to ``url``: trusting ``$ALLOT_NATS_CA`` when set, the
    system's CAs for other ``tls://`` URLs; None for plain ``nats://`` without a CA."""
    ca = os.environ.get(CA_ENV)
    if ca:
        try:
            return ssl.create_default_context(cafile=ca)
        except OSError as exc:  # ssl.SSLError too (a file that is no PEM certificate)
            # A stale export from an earlier `allot up --secure` is the usual cause.
            reason = exc.strerror or str(exc)
            raise ValidationError(CA_ENV, f"cannot read CA file {ca!r}: {reason}") from None
    if urlsplit(url).scheme == "tls":
        return ssl.create_default_context()
    return None


USER_ENV = "ALLOT_NATS_USER"
PASSWORD_ENV = "ALLOT_NATS_PASSWORD"


def nats_url_from_env(environ: Mapping[str, str], default: str) -> str:
    """``$ALLOT_NATS_URL`` (else ``default``), with ``$ALLOT_NATS_USER`` and
    ``$ALLOT_NATS_PASSWORD`` put into each server address that names no user.

    Why: a credentials file of ``allot auth gen`` carries both forms, and a container whose
    environment already says where NATS is (compose's ``ALLOT_NATS_URL:
    nats://nats:4222``, which outranks an ``env_file``) still logs in as that file's user."""
    url = environ.get("ALLOT_NATS_URL") or default
    user, password = environ.get(USER_ENV), environ.get(PASSWORD_ENV)
    if not user or not password:
        return url
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}@"
    out = []
    for part in url.split(","):
        pieces = urlsplit(part.strip())
        if pieces.username or not pieces.netloc:
            out.append(part.strip())
        else:
            out.append(urlunsplit(pieces._replace(netloc=auth + pieces.netloc)))
    return ",".join(out)


REDIS_URL_ENV = "ALLOT_REDIS_URL"
REDIS_PASSWORD_ENV = "ALLOT_REDIS_PASSWORD"
"""The Redis password (``requirepass``), kept apart from the URL: on Kubernetes the URL is
a shared setting (a ConfigMap), the password a Secret only accounting and ranking read."""


def redis_url_from_env(environ: Mapping[str, str], default: str) -> str:
    """``$ALLOT_REDIS_URL`` (else ``default``) with ``$ALLOT_REDIS_PASSWORD`` put into it
    when it names no password itself, as ``nats_url_from_env`` does for NATS logins."""
    url = environ.get(REDIS_URL_ENV) or default
    password = environ.get(REDIS_PASSWORD_ENV)
    pieces = urlsplit(url)
    if not password or pieces.password is not None or not pieces.netloc:
        return url
    user, _, host = pieces.netloc.rpartition("@")
    netloc = f"{user}:{quote(password, safe='')}@{host}"
    return urlunsplit(pieces._replace(netloc=netloc))


def add_nats_url_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """``--nats-url``, defaulting to ``nats_url_from_env(os.environ, default)``. Its help
    shows the default with any password masked: ``--help`` must not print a secret."""
    url = nats_url_from_env(os.environ, default)
    shown = masked_url(url)
    parser.add_argument(
        "--nats-url",
        default=url,
        help="NATS server (env ALLOT_NATS_URL, with ALLOT_NATS_USER and ALLOT_NATS_PASSWORD "
        f"when set; default {shown.replace('%', '%%')})",
    )


def masked_url(url: str) -> str:
    """``url`` (a comma-separated server list too) with every password shown as ``***``:
    for error lines and help, which must never print a secret."""
    return ",".join(_masked(part) for part in url.split(","))


def _masked(url: str) -> str:
    pieces = urlsplit(url.strip())
    if pieces.password is None:
        return url.strip()
    host = pieces.netloc.rpartition("@")[2]
    return urlunsplit(pieces._replace(netloc=f"{pieces.username or ''}:***@{host}"))


def login_for(url: str, environ: Mapping[str, str]) -> str | None:
    """The NATS login a client connecting with ``url`` speaks as: the user of the first
    server address that names one with a password (a user alone is a token: a secret, not
    a name), else ``$ALLOT_NATS_USER``; None without either (no auth)."""
    for part in url.split(","):
        pieces = urlsplit(part.strip())
        if pieces.username and pieces.password is not None:
            return unquote(pieces.username)
    return environ.get(USER_ENV) or None


def inbox_prefix_for_url(url: str) -> str:
    """What a client connecting with ``url`` should pass as ``inbox_prefix``: its user's own
    (``_INBOX_<user>``) when the URL names a user, NATS's default ``_INBOX`` otherwise.
    Service users may read every inbox, so the rule holds for every role."""
    user = urlsplit(url).username
    return inbox_prefix(unquote(user)) if user else "_INBOX"
