"""Who may see which dashboard pages: HTTP Basic users from ``allot auth gen``.

``allot auth gen`` writes ``dashboard-users.json`` (0600) beside ``nats.conf``: each user's
role, allocations and the bcrypt hash of a password for the pages alone
(``ALLOT_DASHBOARD_PASSWORD`` in the user's credentials file), so a person logs in to the
dashboard with their NATS user name and that password, never the NATS one: the dashboard
sees what is typed at its pages, and a NATS password would let a compromised dashboard act
as that person on the bus. The dashboard then applies the NATS roles:

* **team**: the queue shows only its allocations' rows (asked on the per-allocation query
  subjects, as ``allot queue --alloc`` does); a workload page of another allocation is the
  page of an unknown workload (404), so it does not even say the id exists; the hosts page
  names no other allocation. Fair share, owed vs delivered and ``/metrics`` are public to
  every user, as fair share is by design (``docs/security.md``).
* **manager, operator, service**: everything.
* **agent, dashboard**: nothing (403): the logins of programs have no business with pages.

Without a users file the dashboard serves everyone who reaches its port (it binds loopback
by default); ``allot up --secure`` always passes one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import bcrypt

from allot.core.errors import ValidationError
from allot.proto.subjects import UNALLOCATED

DASHBOARD_USERS = "dashboard-users.json"
ROLES = ("team", "manager", "operator", "agent", "dashboard", "service", "streams")
NO_PAGES = frozenset({"agent", "dashboard", "streams"})


@dataclass(frozen=True, slots=True)
class Viewer:
    """An authenticated dashboard user. ``allocations`` None: every allocation."""

    name: str
    role: str
    allocations: frozenset[str] | None = None

    @property
    def allowed(self) -> bool:
        return self.role not in NO_PAGES

    def sees(self, allocation: str | None) -> bool:
        """Whether this user may see work of ``allocation`` (None: unallocated work)."""
        if self.allocations is None:
            return True
        return (allocation if allocation is not None else UNALLOCATED) in self.allocations

    @property
    def scopes(self) -> tuple[str, ...] | None:
        """The allocation tokens to ask per-allocation queries for (None: the whole queue)."""
        return None if self.allocations is None else tuple(sorted(self.allocations))


EVERYONE = Viewer("", "service")
"""The viewer of a dashboard run without a users file."""


PASSWORDS = "dashboard"
"""The file's ``passwords`` marker: its hashes are of the pages' own passwords. A file
without it was written when the pages took the NATS password (decision 0081): refused, so
that an upgrade without ``allot auth gen`` again does not keep asking for NATS passwords."""


def users_document(rows: Mapping[str, Mapping[str, object]]) -> str:
    """The file ``allot auth gen`` writes: ``{"passwords": "dashboard", "users": {name:
    {role, allocations, password}}}`` with bcrypt hashes, never passwords."""
    return json.dumps({"passwords": PASSWORDS, "users": rows}, indent=2, sort_keys=True) + "\n"


class Access:
    """Checks ``Authorization: Basic`` headers against the users file. A bcrypt check costs
    ~0.1 s at nats-server's default cost, and pages poll every 2 s: a verified (user,
    password) pair is remembered by its SHA-256 for the process's life."""

    def __init__(self, users: Mapping[str, tuple[str, Viewer]]) -> None:
        self._users = dict(users)
        self._verified: dict[str, bytes] = {}

    @classmethod
    def load(cls, path: Path | str) -> Access:
        """Raises ``ValidationError`` naming the file's field at fault."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise ValidationError("--users", f"cannot read {path}: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise ValidationError("--users", f"{path} is not JSON: {e}") from None
        rows = data.get("users") if isinstance(data, dict) else None
        if isinstance(data, dict) and data.get("passwords") != PASSWORDS:
            raise ValidationError(
                "passwords",
                f"{path} holds the NATS passwords' hashes (written before the pages had "
                "passwords of their own): run allot auth gen again",
            )
        if not isinstance(rows, dict) or not rows:
            raise ValidationError("users", f"{path} must hold a non-empty 'users' mapping")
        users: dict[str, tuple[str, Viewer]] = {}
        for name, row in rows.items():
            where = f"users.{name}"
            if not isinstance(row, dict):
                raise ValidationError(where, "must be a mapping")
            role, hashed, allocations = row.get("role"), row.get("password"), row.get("allocations")
            if role not in ROLES:
                raise ValidationError(f"{where}.role", f"must be one of {', '.join(ROLES)}")
            if not isinstance(hashed, str) or not hashed.startswith("$2"):
                raise ValidationError(f"{where}.password", "must be a bcrypt hash")
            scope: frozenset[str] | None = None
            if role == "team":
                if not isinstance(allocations, list) or not all(
                    isinstance(a, str) for a in allocations
                ):
                    raise ValidationError(f"{where}.allocations", "must be a list of names")
                scope = frozenset(allocations)
            users[name] = (hashed, Viewer(name, str(role), scope))
        return cls(users)

    def check(self, header: str | None) -> Viewer | None:
        """The viewer a header authenticates, or None (missing, malformed or wrong)."""
        if not header or not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        entry = self._users.get(user)
        if entry is None:
            return None
        hashed, viewer = entry
        digest = hashlib.sha256(password.encode()).digest()
        if self._verified.get(user) == digest:
            return viewer
        if not bcrypt.checkpw(password.encode(), hashed.encode()):
            return None
        self._verified[user] = digest
        return viewer
