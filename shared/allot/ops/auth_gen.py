"""NATS authorization for Allot: budget tree + roles file -> nats-server configuration.

NATS itself enforces who may do what: one account (``ALLOT``, JetStream enabled) holds a
user per person or program, each with publish/subscribe *allow lists* built from the
subject scheme of ``allot.proto.subjects`` (shaped so that one wildcard grant means exactly
one team, subtree or host). Identity is the authenticated user plus the subject; the
services additionally check that a payload agrees with its subject (intake: allocation;
ranking: budget path; health: heartbeat host), so a payload field never names who speaks.
Every command that records a person's name is granted only in its *identity form*, whose
subject ends with (budget changes: holds) the login's own name as a literal token
(``submit.nlp.alice``, ``cancel.nlp.*.user.alice``); the services refuse a payload whose
``user``, ``set_by`` or ``operator`` differs from it. The bare forms are the services'.

Roles (one per row, see ``deploy/roles.example.yaml``):

* ``team``: ``allocations: [leaf, ...]`` (optionally ``unallocated: true``), and optionally
  ``users: [login, ...]``: then every listed user is a login of its own with the team's
  grants (its own password, credentials file, inbox and dashboard login), and the row's
  name is only the team's; without ``users`` the row is one login named by the row.
  Publishes ``submit.<a>.<login>``, ``cancel.<a>.*.user.<login>``, ``watch.<a>``,
  ``query.{queue,prio,status,idle}.<a>`` and the cluster-wide ``TEAM_QUERIES``; subscribes
  ``events.<a>.>``, ``preempt.<a>.*``, ``queued.<a>.*``, ``watched.<a>.*``,
  ``usage.idle.<a>.*`` (its runs flagged idle; not for ``~``), ``ranking``
  and ``budget.tree``; reads the log only through watches the intake service opens for it
  (``allot.bus.log_watch``), never through the JetStream API.
* ``manager``: ``node: <name>`` in the budget tree. Publishes
  ``budget.set.by.<login>.root.<path to node>.>``: every node strictly below it, never the
  node itself; and ``allot.v1.cancel.<a>.*.manager.<login>`` for each allocation ``a`` in
  its subtree (the node itself if it is one): cancelling the workloads charged there, as a
  Slurm account coordinator may. Generated from the tree: an allocation added later needs
  ``auth gen`` again, as a team's grants do.
* ``operator``: ``allot.v1.host.*.drain.<login>`` / ``.undrain.<login>`` (cordoning is a
  drain here) and ``allot.v1.cancel.*.*.operator.<login>``: cancelling anyone's workload,
  as ``scancel`` run by root (a team's grant names only the owner's form, ``.user.``).
* ``agent``: ``hosts: [h, ...]``. Per host, the literal subjects ``host.<h>.heartbeat``,
  ``.health``, ``.report``, ``.sync`` and ``.util`` to publish and ``host.<h>.work`` to
  read; nothing of JetStream. The dispatch service reads the log for agents and appends a
  report only when the subject's host is the primary host of that workload's current
  attempt.
* ``dashboard``: what the dashboard service uses and nothing else: the queries it asks
  (the log itself through ``dashboard.log``, answered by the ranking service) and the one
  it answers (``query.owed``, in the askers' own inboxes); nothing of JetStream, no record,
  command, stream or KV write. The web-facing service does not hold the services' ``>``.
* ``service`` with ``service: <name>`` (intake, accounting, ranking, placement, health,
  dispatch): that service's own login, granted what it sends and hears
  (``SERVICE_GRANTS``: its records and messages, answers in the logins' inboxes, stream
  reads and consumers) and its own inbox to read (decision 0084).
* ``service`` without it: the shared login (the operators' tools, a service without a
  login of its own): every record, command and query subject (``allot.v1.>``), answers in every
  login's inbox, and of JetStream only what the services use (``SERVICES_JETSTREAM``): no
  stream created, updated, purged or deleted, no record deleted (decision 0082); reads
  everything (``>``).
* ``streams``: stream information, creation and update, nothing else: it makes the log's
  streams and the lease bucket before the services start (``allot streams``; an operator's
  step at deploy time and at each upgrade).

No user but the services and the streams login may publish anything of JetStream
(``NOT_SERVICES``: the API,
acks, flow control) nor touch a service durable by name.

Every non-service user receives replies only on its own inbox prefix ``_INBOX_<user>``
(``inbox_prefix`` of ``nats.connect``): the default ``_INBOX.>`` is never granted, so one
user cannot read another's replies or JetStream deliveries.

``render_config`` is pure (users, permissions and password hashes in, text out);
``generate`` adds the side effects: random passwords, bcrypt hashes, files (0600).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import quote, urlsplit, urlunsplit

from allot.auth.client import CA_ENV, REDIS_PASSWORD_ENV, inbox_prefix
from allot.auth.dashboard import DASHBOARD_USERS, users_document
from allot.bus import LEADER_BUCKET
from allot.core.budgets import BudgetTree, subtree_allocations
from allot.core.errors import ValidationError
from allot.proto import subjects as s

Role = Literal["team", "manager", "operator", "agent", "dashboard", "service", "streams"]
ROLES: tuple[Role, ...] = (
    "team",
    "manager",
    "operator",
    "agent",
    "dashboard",
    "service",
    "streams",
)

ACCOUNT = "ALLOT"
DEFAULT_BCRYPT_COST = 11
"""nats-server's own ``passwd`` tool default: ~0.1 s per connection check."""
CONFIG_NAME = "nats.conf"
USERS_DIR = "users"
DASHBOARD_PASSWORD_ENV = "ALLOT_DASHBOARD_PASSWORD"
ROUTE_PASSWORD_ENV = "NATS_ROUTE_PASSWORD"
REDIS_ENV = "redis.env"
"""Redis's password (``ALLOT_REDIS_PASSWORD``): the Redis of deploy/k8s takes it
(``requirepass``; with Sentinel, its replica and sentinels too), and only accounting and
ranking, which use Redis, are given it. Kept across runs, as the routes' is: Redis holds
the one it started with; delete the file to change it (decision 0083)."""
ROUTE_ENV = "nats-route.env"
"""The cluster routes' password (``NATS_ROUTE_PASSWORD``): a NATS cluster's servers log in
to each other with it (deploy/k8s's nats.conf), so a process that reaches the route port
without it cannot join the cluster and with it read and write every stream."""

_USER_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_USER_FIELDS: dict[Role, tuple[str, ...]] = {
    "team": ("name", "role", "allocations", "unallocated", "users"),
    "manager": ("name", "role", "node"),
    "operator": ("name", "role"),
    "agent": ("name", "role", "hosts"),
    "dashboard": ("name", "role"),
    "service": ("name", "role", "service"),
    "streams": ("name", "role"),
}
_JS_API = "$JS.API"
TEAM_QUERIES: tuple[str, ...] = (
    s.QUERY_SHARE,
    s.QUERY_ALLOCATIONS,
    s.QUERY_OWED,
    s.QUERY_USAGE,
    s.QUERY_HOSTS,
    s.QUERY_PLACEMENT_STATS,
)
"""Queries every team may ask: budgets, fair share, owed vs delivered, host states (with
the opaque ids of the work on them), scheduler timings. The queue, priorities and
statuses only per allocation (``subjects.query_scoped``)."""


# -- the roles file --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserSpec:
    """One login of the roles file, validated against the budget tree."""

    name: str
    role: Role
    allocations: tuple[str, ...] = ()
    unallocated: bool = False
    node: str | None = None
    hosts: tuple[str, ...] = ()
    team: str | None = None
    """The team row that listed this login under ``users`` (None: the row is the login)."""
    service: str | None = None
    """A ``service`` login's one service (``SERVICE_NAMES``), or None: the shared login."""


def parse_roles(data: object, tree: BudgetTree) -> tuple[UserSpec, ...]:
    """``{"users": [{"name": ..., "role": ..., ...}, ...]}`` -> validated logins, one per
    row, or one per listed user of a team row with ``users``.

    Errors name the field (``users[2].allocations[0]``, ``users[0].users[1]``) and the
    reason; a login is one name: a listed user named twice, or named as another row, is
    refused."""
    if not isinstance(data, Mapping):
        raise ValidationError("roles", f"must be a mapping with 'users', got {_kind(data)}")
    extra = sorted(str(k) for k in data if k != "users")
    if extra:
        raise ValidationError("roles", f"unknown field(s) {', '.join(extra)}; only 'users'")
    rows = data.get("users")
    if not isinstance(rows, list) or not rows:
        raise ValidationError("users", "must be a non-empty list of users")
    parsed: list[tuple[UserSpec, tuple[str, ...] | None]] = []
    seen: dict[str, str] = {}
    for i, row in enumerate(rows):
        user, members = _parse_user(row, f"users[{i}]", tree)
        if user.name in seen:
            raise ValidationError(f"users[{i}].name", f"{user.name!r} repeats {seen[user.name]}")
        seen[user.name] = f"users[{i}]"
        parsed.append((user, members))
    rows_named = dict(seen)
    logins: list[UserSpec] = []
    for i, (user, members) in enumerate(parsed):
        if members is None:
            logins.append(user)
            continue
        for j, member in enumerate(members):
            where = f"users[{i}].users[{j}]"
            first = seen.get(member)
            if first is not None and first != f"users[{i}]":
                what = "the name of" if first in rows_named.values() else "also listed at"
                raise ValidationError(where, f"{member!r} is {what} {first}: one login, one role")
            seen[member] = where
            logins.append(dataclasses.replace(user, name=member, team=user.name))
    if not any(u.role == "service" and u.service is None for u in logins):
        raise ValidationError(
            "users",
            "needs at least one user with role 'service' and no 'service' field (the shared "
            "login: services without a login of their own, and the operators' tools)",
        )
    if not any(u.role == "streams" for u in logins):
        raise ValidationError(
            "users",
            "needs at least one user with role 'streams' (it makes the log's streams before "
            "the services start: `allot streams`; the services' login may not)",
        )
    return tuple(logins)


def _parse_user(
    row: object, where: str, tree: BudgetTree
) -> tuple[UserSpec, tuple[str, ...] | None]:
    """One row, and its listed users (a team's ``users``; None when the row is the login)."""
    if not isinstance(row, Mapping):
        raise ValidationError(where, f"must be a mapping, got {_kind(row)}")
    name = row.get("name")
    if not isinstance(name, str) or not _USER_RE.fullmatch(name):
        raise ValidationError(
            f"{where}.name", f"must be 1-64 characters of [A-Za-z0-9_-], got {name!r}"
        )
    role = row.get("role")
    if role not in ROLES:
        raise ValidationError(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    extra = sorted(str(k) for k in row if k not in _USER_FIELDS[role])
    if extra:
        raise ValidationError(where, f"unknown field(s) for role {role!r}: {', '.join(extra)}")
    if role == "team":
        allocations = _names(row.get("allocations", []), f"{where}.allocations")
        unallocated = row.get("unallocated", False)
        if not isinstance(unallocated, bool):
            raise ValidationError(
                f"{where}.unallocated", f"must be true or false, got {unallocated!r}"
            )
        for j, a in enumerate(allocations):
            if not tree.is_leaf(a):
                raise ValidationError(
                    f"{where}.allocations[{j}]",
                    f"{a!r} is not an allocation (a leaf) of the budget tree; "
                    f"allocations: {', '.join(tree.leaves()[:20])}",
                )
        if not allocations and not unallocated:
            raise ValidationError(
                f"{where}.allocations", "a team needs at least one allocation (or unallocated)"
            )
        members = None
        if "users" in row:
            members = _logins(row["users"], f"{where}.users")
            if not members:
                raise ValidationError(
                    f"{where}.users",
                    f"lists no user; leave it out for one login named {name!r}",
                )
        return UserSpec(name, role, allocations=allocations, unallocated=unallocated), members
    if role == "manager":
        node = row.get("node")
        if not isinstance(node, str) or node not in tree.index.position:
            raise ValidationError(f"{where}.node", f"{node!r} is not a node of the budget tree")
        return UserSpec(name, role, node=node), None
    if role == "agent":
        hosts = _names(row.get("hosts"), f"{where}.hosts")
        if not hosts:
            raise ValidationError(f"{where}.hosts", "an agent needs at least one host")
        return UserSpec(name, role, hosts=hosts), None
    if role == "service" and row.get("service") is not None:
        service = row["service"]
        if service not in SERVICE_NAMES:
            raise ValidationError(
                f"{where}.service", f"must be one of {', '.join(SERVICE_NAMES)}, got {service!r}"
            )
        return UserSpec(name, role, service=service), None
    return UserSpec(name, role), None


def _logins(value: object, where: str) -> tuple[str, ...]:
    """A team's ``users``: login names, each once in the list."""
    if not isinstance(value, list):
        raise ValidationError(where, f"must be a list of user names, got {_kind(value)}")
    out: list[str] = []
    for j, name in enumerate(value):
        if not isinstance(name, str) or not _USER_RE.fullmatch(name):
            raise ValidationError(
                f"{where}[{j}]", f"must be 1-64 characters of [A-Za-z0-9_-], got {name!r}"
            )
        if name in out:
            raise ValidationError(f"{where}[{j}]", f"{name!r} repeats {where}[{out.index(name)}]")
        out.append(name)
    return tuple(out)


def _names(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValidationError(where, f"must be a list of names, got {_kind(value)}")
    out = tuple(s.validate_token(v, f"{where}[{j}]") for j, v in enumerate(value))
    dup = {v for v in out if out.count(v) > 1}
    if dup:
        raise ValidationError(where, f"repeats {', '.join(sorted(dup))}")
    return out


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


# -- grants ----------------------------------------------------------------------------------


SERVICE_DURABLE_API: tuple[str, ...] = tuple(
    pattern
    for durable in s.SERVICE_DURABLES
    for pattern in (
        f"{_JS_API}.CONSUMER.*.*.{durable}",
        f"{_JS_API}.CONSUMER.*.*.{durable}.>",
        f"{_JS_API}.CONSUMER.*.*.*.{durable}",
    )
)
"""Every JetStream API subject that names a service durable: create, info, delete, pause
(``CONSUMER.<verb>.<stream>.<name>``, a create's filter after it), the legacy durable
create and a pull (``CONSUMER.{DURABLE.CREATE,MSG.NEXT}.<stream>.<name>``): whoever pulls
from accounting's durable takes records it would charge."""

NOT_SERVICES: tuple[str, ...] = ("$JS.>", "$KV.>", "$O.>", "$SYS.>", *SERVICE_DURABLE_API)
"""Denied to every user but the services, whatever their allow list says: the JetStream
API (a consumer's name, filter and delivery subject are the creator's choice: a team could
re-point a service's durable or have the server publish anywhere), acks and flow control,
KV, object store and system subjects. Each service durable is also named, so a grant
widened by hand still cannot touch it."""


SERVICE_JETSTREAM_READS: tuple[str, ...] = (
    f"{_JS_API}.STREAM.INFO.*",
    f"{_JS_API}.STREAM.MSG.GET.*",
    f"{_JS_API}.DIRECT.GET.>",
    f"{_JS_API}.CONSUMER.CREATE.>",
    f"{_JS_API}.CONSUMER.INFO.>",
    f"{_JS_API}.CONSUMER.DELETE.>",
    f"{_JS_API}.CONSUMER.MSG.NEXT.>",
    "$JS.FC.>",
)
"""What every service's own login may ask of JetStream: stream information and records,
its consumers (ordered, polled, history pages, intake's watches), their flow control."""

SERVICES_JETSTREAM: tuple[str, ...] = (
    *SERVICE_JETSTREAM_READS,
    *(
        f"{_JS_API}.{api}"
        for api in (
            "INFO",
            "STREAM.NAMES",
            "STREAM.LIST",
            "CONSUMER.DURABLE.CREATE.>",
            "CONSUMER.NAMES.>",
            "CONSUMER.LIST.>",
        )
    ),
    "$JS.ACK.>",
    f"$KV.{LEADER_BUCKET}.>",
)
"""The JetStream the services use, and all of it the shared services' login may publish
(decision 0082): the reads above, listings, acks, the placement lease's key. Not a
stream's create, update, delete or purge, a record's delete, a restore, a consumer's reset
or pause, nor any API a later server adds: whatever is not listed is refused."""


@dataclass(frozen=True, slots=True)
class ServiceGrant:
    """One service's own subjects: what it publishes (records, core messages; answers go
    to every login's inbox), what it subscribes to (commands, queries, reports; its own
    inbox is added), and JetStream beyond ``SERVICE_JETSTREAM_READS``."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    jetstream: tuple[str, ...] = ()


def _events(*names: str) -> tuple[str, ...]:
    return tuple(f"{s.PREFIX}.events.*.*.{name}" for name in names)


def _queries(*queries: str) -> tuple[str, ...]:
    """A query subject and its scoped form (``query.queue`` and ``query.queue.<a>``)."""
    return tuple(x for q in queries for x in (q, f"{q}.*"))


SERVICE_GRANTS: dict[str, ServiceGrant] = {
    "intake": ServiceGrant(
        publish=_events("submitted", "cancel_requested"),
        subscribe=(
            f"{s.PREFIX}.submit.>",
            f"{s.PREFIX}.cancel.>",
            s.QUERY_INTAKE,
            f"{s.PREFIX}.watch.*",
        ),
    ),
    "accounting": ServiceGrant(
        publish=(),
        subscribe=(s.QUERY_USAGE,),
        jetstream=(f"{_JS_API}.CONSUMER.DURABLE.CREATE.>", "$JS.ACK.WORKLOADS.accounting.>"),
    ),
    "ranking": ServiceGrant(
        publish=(s.BUDGET_TREE, s.RANKING),
        subscribe=(s.ALL_BUDGET_SET, s.QUERY_SHARE, s.QUERY_HISTORY, s.DASHBOARD_LOG),
    ),
    "placement": ServiceGrant(
        publish=(
            s.LEADER,
            *_events("placed", "requeued", "cancelled"),
            f"{s.PREFIX}.preempt.*.*",
            s.ALL_HOST_STATE,
            f"{s.PREFIX}.queued.*.*",
        ),
        subscribe=(
            s.RANKING,
            *_queries(s.QUERY_QUEUE, s.QUERY_PRIO, s.QUERY_STATUS, s.QUERY_HOSTS),
            *_queries(s.QUERY_ALLOCATIONS, s.QUERY_PLACEMENT_STATS),
        ),
        jetstream=(f"$KV.{LEADER_BUCKET}.>",),
    ),
    "health": ServiceGrant(
        publish=(s.ALL_HOST_STATE, f"{s.PREFIX}.usage.gpu.*", f"{s.PREFIX}.usage.idle.*.*"),
        subscribe=(
            s.ALL_HEARTBEATS,
            s.ALL_HEALTH,
            *_queries(s.ALL_DRAIN, s.ALL_UNDRAIN),
            s.ALL_HOST_UTIL,
            *_queries(s.QUERY_IDLE),
        ),
    ),
    "dispatch": ServiceGrant(
        publish=(
            *_events("started", "completed", "failed", "preempted", "cancelled"),
            f"{s.PREFIX}.host.*.work",
        ),
        subscribe=(f"{s.PREFIX}.host.*.report", s.HOSTS_REPORT, f"{s.PREFIX}.host.*.sync"),
    ),
}
"""Each service's own login (a ``service`` row with ``service: <name>``): a compromised
one sends only its own kinds of records and messages (decision 0084)."""
SERVICE_NAMES: tuple[str, ...] = tuple(SERVICE_GRANTS)


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()


def budget_path(tree: BudgetTree, node: str) -> tuple[str, ...]:
    """The subject path of ``node``: ``("root", <names below the tree's root>..., node)``
    (subjects always start at ``root``, whatever the tree's root is called)."""
    names = tree.path(node).split("/")
    return (s.BUDGET_ROOT, *names[1:])


ASKERS: frozenset[Role] = frozenset({"team", "manager", "operator", "service"})
"""The roles that may ask what the dashboard answers (``query.owed``: every team)."""


def permissions(
    user: UserSpec, tree: BudgetTree, askers: Sequence[str] = (), logins: Sequence[str] = ()
) -> Permissions:
    """What ``user`` may publish and subscribe to (allow lists; everything else is denied).
    ``askers``: the logins whose inboxes a dashboard user may answer (``ASKERS``' logins);
    ``logins``: every login, whose inboxes the services answer in."""
    inbox = f"{inbox_prefix(user.name)}.>"
    if user.role == "service":
        inboxes = ("_INBOX.>", *(f"{inbox_prefix(login)}.>" for login in logins))
        if user.service is not None:  # what that service sends and hears, nothing more
            own = SERVICE_GRANTS[user.service]
            return Permissions(
                publish=(*own.publish, *inboxes, *SERVICE_JETSTREAM_READS, *own.jetstream),
                subscribe=(*own.subscribe, inbox),
            )
        # Records, commands and queries (``allot.v1.>``), answers in any login's inbox, the
        # JetStream they use; everything to read.
        return Permissions(
            publish=(f"{s.PREFIX}.>", *inboxes, *SERVICES_JETSTREAM), subscribe=(">",)
        )
    if user.role == "streams":
        # Stream information, creation and update (the lease bucket is a stream too), the
        # answers in its own inbox; no record, no consumer, no delete or purge.
        return Permissions(
            publish=tuple(f"{_JS_API}.STREAM.{verb}.*" for verb in ("INFO", "CREATE", "UPDATE")),
            subscribe=(inbox,),
        )
    if user.role == "dashboard":
        # Its pages ask the services (the SDK's queries; the log: ``dashboard.log``); it
        # answers ``query.owed`` in the askers' own inboxes. Not nats-server's
        # ``allow_responses``: the dashboard may ask its own subjects, and would then be
        # let to publish once on any reply subject it named (found by a review). No
        # JetStream API: any grant of it steers the server's answers and consumer
        # deliveries onto any subject (decision 0080).
        return Permissions(
            publish=(
                f"{s.PREFIX}.query.>",
                s.DASHBOARD_LOG,
                *(f"{inbox_prefix(a)}.>" for a in askers),
            ),
            subscribe=(inbox, s.QUERY_OWED),
            deny_publish=NOT_SERVICES,
        )
    if user.role == "team":
        tokens = [*user.allocations, *([s.UNALLOCATED] if user.unallocated else [])]
        pub: list[str] = []
        sub: list[str] = [inbox, s.RANKING, s.BUDGET_TREE]
        for a in tokens:
            # Commands in their identity forms only, naming this login (the services refuse
            # a payload naming someone else); queue positions of the allocation's work.
            pub += [f"{s.PREFIX}.submit.{a}.{user.name}", _own_cancels(a, s.OWNER, user.name)]
            pub += [s.query_scoped(q, a) for q in (s.QUERY_QUEUE, s.QUERY_PRIO, s.QUERY_STATUS)]
            sub.append(s.allocation_queued(None if a == s.UNALLOCATED else a))
            if a != s.UNALLOCATED:  # only allocated work is flagged idle
                pub.append(s.query_scoped(s.QUERY_IDLE, a))
                sub.append(s.allocation_idle(a))
            # The log through the services' watches only (``allot.bus.log_watch``).
            pub.append(s.watch(a))
            sub += [s.allocation_events(a), s.allocation_preempt(a), s.allocation_watched(a)]
        pub += [*TEAM_QUERIES]
        return Permissions(publish=tuple(pub), subscribe=tuple(sub), deny_publish=NOT_SERVICES)
    if user.role == "manager":
        assert user.node is not None
        grant = s.budget_subtree(budget_path(tree, user.node), user.name)
        cancels = tuple(
            _own_cancels(s.allocation_token(a), s.MANAGER, user.name)
            for a in subtree_allocations(tree, user.node)
        )
        return Permissions(
            publish=(grant, *cancels, f"{s.PREFIX}.query.>"),
            subscribe=(inbox, s.RANKING, s.BUDGET_TREE),
            deny_publish=NOT_SERVICES,
        )
    if user.role == "operator":
        return Permissions(
            publish=(
                f"{s.ALL_DRAIN}.{user.name}",
                f"{s.ALL_UNDRAIN}.{user.name}",
                _own_cancels("*", s.OPERATOR, user.name),
                f"{s.PREFIX}.query.>",
            ),
            subscribe=(inbox, s.ALL_HOST_STATE),
            deny_publish=NOT_SERVICES,
        )
    # agent: its own hosts' subjects only, all literal; no JetStream API at all (the dispatch
    # service reads the log for it and checks each report's host).
    agent_pub = []
    agent_sub = [inbox]
    for h in user.hosts:
        agent_pub += [s.heartbeat(h), s.health(h), s.host_report(h), s.host_sync(h)]
        agent_pub.append(s.host_util(h))
        agent_sub.append(s.host_work(h))
    return Permissions(
        publish=tuple(agent_pub), subscribe=tuple(agent_sub), deny_publish=NOT_SERVICES
    )


def _own_cancels(allocation: str, form: str, login: str) -> str:
    """The cancels of ``allocation``'s workloads (``*``: any) in ``form``, sent as ``login``."""
    return f"{s.PREFIX}.cancel.{allocation}.*.{form}.{login}"


# -- rendering -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Server certificate and key (PEM), and the CA that signed it (clients trust it)."""

    cert_file: Path
    key_file: Path
    ca_file: Path


def _q(text: str) -> str:
    # nats-server's config reads JSON-style double-quoted strings; quoting also keeps `$`
    # (JetStream subjects, bcrypt hashes) from being read as a variable reference.
    return json.dumps(text)


def render_config(
    users: Sequence[UserSpec],
    grants: Mapping[str, Permissions],
    password_hashes: Mapping[str, str],
    *,
    tls: TlsFiles | None = None,
) -> str:
    """The nats-server configuration text (accounts and, if given, TLS). Listen address,
    ports and the JetStream store stay on the command line or in an including file."""
    lines = [
        "# Generated by `allot auth gen`: edit the roles file and regenerate instead.",
        "# One account; per-user allow lists (everything not listed is refused, logged by",
        "# the server as a Publish/Subscription Violation).",
    ]
    if tls is not None:
        lines += [
            "tls {",
            f"  cert_file: {_q(str(tls.cert_file))}",
            f"  key_file: {_q(str(tls.key_file))}",
            f"  ca_file: {_q(str(tls.ca_file))}",
            "  timeout: 2",
            "}",
        ]
    lines += ["accounts {", f"  {ACCOUNT} {{", "    jetstream: enabled", "    users = ["]
    for user in users:
        p = grants[user.name]
        lines += [
            f"      # {user.role}{_detail(user)}",
            "      {",
            f"        user: {_q(user.name)}",
            f"        password: {_q(password_hashes[user.name])}",
            "        permissions: {",
            f"          publish: {{ allow: [{', '.join(_q(x) for x in p.publish)}]"
            + (f", deny: [{', '.join(_q(x) for x in p.deny_publish)}]" if p.deny_publish else "")
            + " }",
            f"          subscribe: {{ allow: [{', '.join(_q(x) for x in p.subscribe)}] }}",
            "        }",
            "      }",
        ]
    lines += ["    ]", "  }", "}", ""]
    return "\n".join(lines)


def _detail(user: UserSpec) -> str:
    if user.role == "team":
        extra = ["~ (unallocated)"] if user.unallocated else []
        team = "" if user.team is None else f" (team {user.team})"
        return ": " + ", ".join([*user.allocations, *extra]) + team
    if user.role == "manager":
        return f": subtree below {user.node}"
    if user.role == "agent":
        return ": " + ", ".join(user.hosts)
    if user.service is not None:
        return f": {user.service} only"
    return ""


# -- generating ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str
    role: Role
    password: str
    inbox_prefix: str
    """``_INBOX_<user>`` (a service user may also read the default ``_INBOX``)."""
    path: Path
    dashboard_password: str = ""
    """The password of the dashboard's pages (HTTP Basic), not the NATS one: the dashboard
    sees what people type there, and a NATS password would let it act as them."""
    service: str | None = None
    """A service login's one service (None: the shared services' login, or another role)."""

    def url(self, server_url: str) -> str:
        """``server_url`` with this user's name and password in it (nats-py reads them)."""
        parts = urlsplit(server_url)
        if not parts.hostname:
            raise ValidationError("server_url", f"{server_url!r} has no host")
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        port = f":{parts.port}" if parts.port else ""
        auth = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}"
        return urlunsplit((parts.scheme, f"{auth}@{host}{port}", parts.path, "", ""))


@dataclass(frozen=True, slots=True)
class GeneratedAuth:
    config_path: Path
    config_text: str
    users: dict[str, Credentials] = field(default_factory=dict)
    grants: dict[str, Permissions] = field(default_factory=dict)
    dashboard_users: Path | None = None
    """``dashboard-users.json``: the dashboard's logins (``allot.auth.dashboard``)."""
    route_env: Path | None = None
    """``nats-route.env``: the password of a NATS cluster's routes (``ROUTE_ENV``)."""
    redis_env: Path | None = None
    """``redis.env``: the password Redis takes and accounting and ranking give (``REDIS_ENV``)."""
    redis_password: str | None = field(default=None, repr=False)
    """What ``redis_env`` holds (``allot up --secure`` gives it to its own Redis)."""

    def url(self, user: str, server_url: str) -> str:
        return self.users[user].url(server_url)

    def first(self, role: Role) -> Credentials:
        """The first user with ``role`` (e.g. the service user the stack connects as); of
        the services' logins, the shared one (no ``service`` of its own)."""
        for creds in self.users.values():
            if creds.role == role and creds.service is None:
                return creds
        raise ValidationError("roles", f"no user with role {role!r}")

    def of_service(self, service: str) -> Credentials | None:
        """The login of ``service`` alone (a ``service`` row naming it), or None."""
        return next((c for c in self.users.values() if c.service == service), None)


def hash_password(password: str, cost: int = DEFAULT_BCRYPT_COST) -> str:
    """bcrypt with the ``$2a$`` prefix, which every nats-server version recognises."""
    try:
        import bcrypt  # noqa: PLC0415  (optional until the lead adds it to the dependencies)
    except ImportError:  # pragma: no cover - depends on the environment
        raise ValidationError(
            "bcrypt", "the `bcrypt` package is needed to hash passwords: pip install bcrypt"
        ) from None
    salt = bcrypt.gensalt(rounds=cost, prefix=b"2a")
    return bcrypt.hashpw(password.encode(), salt).decode()


def generate(
    tree: BudgetTree,
    roles: Sequence[UserSpec] | Mapping[str, object],
    out_dir: Path | str,
    *,
    server_url: str = "nats://127.0.0.1:4222",
    tls: TlsFiles | None = None,
    cost: int = DEFAULT_BCRYPT_COST,
) -> GeneratedAuth:
    """Write ``out_dir/nats.conf`` and ``out_dir/users/<user>.env`` (both 0600) with fresh
    random passwords; return every user's credentials (``.url(server)`` for clients).
    Regenerating replaces every user's password; the routes' (``nats-route.env``) is kept
    until that file is deleted."""
    users = tuple(roles) if not isinstance(roles, Mapping) else parse_roles(roles, tree)
    out = Path(out_dir)
    (out / USERS_DIR).mkdir(parents=True, exist_ok=True, mode=0o700)
    passwords = {u.name: secrets.token_urlsafe(24) for u in users}
    page_passwords = {u.name: secrets.token_urlsafe(18) for u in users}
    askers = tuple(u.name for u in users if u.role in ASKERS)
    names = tuple(u.name for u in users)
    grants = {u.name: permissions(u, tree, askers, names) for u in users}
    hashes = {u.name: hash_password(passwords[u.name], cost) for u in users}
    text = render_config(users, grants, hashes, tls=tls)
    config_path = out / CONFIG_NAME
    _write_private(config_path, text)
    creds: dict[str, Credentials] = {}
    for u in users:
        prefix = inbox_prefix(u.name)
        c = Credentials(
            u.name,
            u.role,
            passwords[u.name],
            prefix,
            out / USERS_DIR / f"{u.name}.env",
            page_passwords[u.name],
            u.service,
        )
        _write_private(c.path, _env_file(c, server_url, None if tls is None else tls.ca_file))
        creds[u.name] = c
    # The dashboard's logins: the same users, a password of their own (the dashboard sees
    # what is typed at its pages: never a NATS password), with what each may see.
    rows = {
        u.name: {
            "role": u.role,
            "allocations": [*u.allocations, *([s.UNALLOCATED] if u.unallocated else [])],
            "password": hash_password(page_passwords[u.name], cost),
        }
        for u in users
    }
    _write_private(out / DASHBOARD_USERS, users_document(rows))
    # The routes' password is kept across runs (a new one stalls a cluster's rolling
    # update: docs/deploy-kubernetes.md); delete the file to change it.
    kept = _kept(out / ROUTE_ENV, ROUTE_PASSWORD_ENV)
    route = kept if kept is not None else lettered_password(secrets.token_urlsafe(24))
    _write_private(out / ROUTE_ENV, _route_env_file(route))
    # Redis's too: the server holds it until restarted (decision 0083).
    kept = _kept(out / REDIS_ENV, REDIS_PASSWORD_ENV)
    redis_password = kept if kept is not None else lettered_password(secrets.token_urlsafe(24))
    _write_private(out / REDIS_ENV, _redis_env_file(redis_password))
    return GeneratedAuth(
        config_path=config_path,
        config_text=text,
        users=creds,
        grants=grants,
        dashboard_users=out / DASHBOARD_USERS,
        route_env=out / ROUTE_ENV,
        redis_env=out / REDIS_ENV,
        redis_password=redis_password,
    )


def lettered_password(token: str) -> str:
    """A password made of a URL-safe ``token``, led by a letter: nats-server reads the
    variable that holds the routes' (``password: $NATS_ROUTE_PASSWORD``) as a value of its
    configuration, and one that starts with ``-`` or digits then ``-`` fails to parse
    (as a number or a date), so the servers would not start (decision 0078). Redis's is
    made alike (``_kept`` reads both back by that shape)."""
    return "r" + token


def _kept(path: Path, variable: str) -> str | None:
    """The password ``variable`` of an earlier run's file, if it holds one of ours."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    found = re.search(rf"(?m)^{variable}=(r[A-Za-z0-9_-]{{32,}})$", text)
    return found[1] if found else None


def _route_env_file(password: str) -> str:
    """The routes' password (URL-safe: the servers' route URLs carry it as their login)."""
    return (
        "# The password NATS cluster servers log in to each other's routes with. Secret: keep"
        " it 0600.\n"
        f"{ROUTE_PASSWORD_ENV}={password}\n"
    )


def _redis_env_file(password: str) -> str:
    """Redis's password: the server's ``requirepass`` and the clients' login (deploy/k8s)."""
    return (
        "# The password Redis takes (requirepass) and accounting and ranking log in with\n"
        "# (ALLOT_REDIS_PASSWORD: allot.auth.client.redis_url_from_env). Secret: keep it 0600.\n"
        f"{REDIS_PASSWORD_ENV}={password}\n"
    )


def _env_file(c: Credentials, server_url: str, ca_file: Path | None) -> str:
    """The user's environment: the URL with its login, and with TLS the CA to trust (a
    client of a ``tls://`` server with a loopback CA fails to verify it without one)."""
    lines = [
        f"# Allot NATS credentials of {c.user} (role {c.role}). Secret: keep it 0600.",
        "# `set -a; . this-file; set +a` and the allot CLI and services pick up the URL.",
        f"ALLOT_NATS_USER={c.user}",
        f"ALLOT_NATS_PASSWORD={c.password}",
        f"ALLOT_NATS_URL={c.url(server_url)}",
    ]
    lines.append(f"ALLOT_NATS_INBOX_PREFIX={c.inbox_prefix}")
    if c.dashboard_password:
        lines.append("# The dashboard's pages: this user and this password (not the NATS one).")
        lines.append(f"{DASHBOARD_PASSWORD_ENV}={c.dashboard_password}")
    if ca_file is not None:
        lines.append(f"{CA_ENV}={Path(ca_file).resolve()}")
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str) -> None:
    # Created 0600 from the start (no window where another user could read it).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its old mode through O_CREAT
