"""The OS account a part runs as under ``--run-as-user`` (Slurm's model: a job runs as the
user who submitted it, whose account every host shares through LDAP or the like).

The submission's ``user`` is its sender's login under ``allot auth gen``'s credentials
(intake checks it), so the account is the login's name on the host. The agent (root)
switches to it for the part: uid, primary gid and the account's own groups (never the
agent's: root's group would come along), and an environment of a login's rather than the
agent's (``Account.base_env``: ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, and of the
agent's only ``PATH``, ``LANG``, ``TZ`` and what ``--pass-env`` names); the part starts in
``/`` (the agent, still root when it changes directory, must not enter a home for it).
A part whose user has no account here, or an account below ``--run-as-min-uid`` (root and
the system accounts: a login named ``root`` or ``daemon`` must not run as them), or one in
group 0, is refused before it starts, the reason naming ``user``.

The agent's own file work for such a part runs as the account too (``account_shell``), or
through paths no account can redirect (``safe_paths``).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from allot.core.errors import ValidationError

DEFAULT_MIN_UID = 1000
"""The lowest uid a part may run as (Debian's and Red Hat's first user account)."""
PASSED_ENV = ("PATH", "LANG", "TZ")
"""What a part run as its account inherits of the agent's environment (with ``--pass-env``
names, more)."""
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
"""A part's ``PATH`` when the agent has none (Debian's for a user's login)."""
NO_ID = 2**32 - 1
"""``(uid_t)-1``: to ``setreuid`` and ``setregid``, "leave unchanged"."""


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    """The account's home directory (its ``HOME``)."""
    shell: str = "/bin/sh"

    def env(self) -> dict[str, str]:
        """What ``login`` sets of the environment for this account."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "SHELL": self.shell}

    def base_env(self, agent_env: Mapping[str, str], names: Iterable[str] = ()) -> dict[str, str]:
        """The environment a part run as this account starts from, before the submission's
        ``env``: a login's (``env``), plus only ``PASSED_ENV`` and ``names`` of the agent's
        own; none of the rest (a deployment's settings, whatever the operator exported)."""
        env = {k: agent_env[k] for k in (*PASSED_ENV, *names) if k in agent_env}
        env.setdefault("PATH", DEFAULT_PATH)
        env.update(self.env())
        return env


def can_switch() -> bool:
    """Whether this process may become another user (root)."""
    return os.geteuid() == 0


def account_of(user: str | None, min_uid: int) -> Account:
    """The account ``user`` runs as here; ``ValidationError`` naming ``user`` when none may."""
    if not user:
        raise ValidationError(
            "user",
            "the part names no user, and this agent runs each part as its user "
            "(--run-as-user): upgrade the dispatch service",
        )
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValidationError(
            "user", f"{user!r} has no account on this host (--run-as-user runs parts as it)"
        ) from None
    if NO_ID in (entry.pw_uid, entry.pw_gid):
        # (uid_t)-1 tells setreuid "leave it unchanged": the part would stay root.
        raise ValidationError("user", f"{user!r} has uid or gid {NO_ID}, which switches nothing")
    if entry.pw_uid < min_uid:
        raise ValidationError(
            "user",
            f"{user!r} is uid {entry.pw_uid}, below this agent's --run-as-min-uid {min_uid}: "
            "root and system accounts run no workloads",
        )
    groups = tuple(sorted(set(os.getgrouplist(user, entry.pw_gid))))
    if 0 in groups:
        raise ValidationError("user", f"{user!r} is in group 0 (root's): it runs no workloads")
    return Account(
        user, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/", entry.pw_shell or "/bin/sh"
    )


__all__ = ["DEFAULT_MIN_UID", "PASSED_ENV", "Account", "account_of", "can_switch"]
