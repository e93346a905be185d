"""NATS subjects of the wire contract, version 1.

Every subject starts with ``allot.v1``. Names that go into a subject (allocations, workloads,
hosts, budget nodes) are single tokens, checked by ``validate_token``: never empty, no
``.``, ``*``, ``>`` or whitespace, at most ``MAX_TOKEN_LEN`` characters. The core already
restricts budget-tree names to ``[A-Za-z0-9_-]``.

The scheme is shaped so that one wildcard grant in a NATS user's permissions means exactly
one team, subtree or host:

==========================================  ============================  ==========================
subject                                     message(s)                    grant example
==========================================  ============================  ==========================
...submit.<a>.<login>                       SubmitWorkload (request)      ...submit.nlp.alice
...cancel.<a>.<w>.user.<login>              CancelWorkload (owner)        ...cancel.nlp.*.user.alice
...cancel.<a>.<w>.operator.<login>          CancelWorkload (operator)     ...*.*.operator.ops
...cancel.<a>.<w>.manager.<login>           CancelWorkload (manager)      ...nlp.*.manager.lead
...budget.set.by.<login>.root.<a>...<node>  SetBudget (request)           ...by.lead.root.nlp.>
...host.<host>.drain.<login>                DrainHost (operator)          ...host.*.drain.ops
...host.<host>.undrain.<login>              UndrainHost (operator)        ...host.*.undrain.ops
...submit.<a>                               SubmitWorkload (bare form)    (services only)
...cancel.<a>.<w>                           CancelWorkload (bare form)    (services only)
...cancel.<a>.<w>.operator                  CancelWorkload (bare form)    (services only)
...cancel.<a>.<w>.manager                   CancelWorkload (bare form)    (services only)
...budget.set.root.<a>...<node>             SetBudget (bare form)         (services only)
...host.<host>.drain                        DrainHost (bare form)         (services only)
...host.<host>.undrain                      UndrainHost (bare form)       (services only)
...host.<host>.heartbeat                    Heartbeat (agent)             ...host.h01.heartbeat
...host.<host>.health                       HealthReport (agent)          ...host.h01.health
...host.<host>.report                       PartReport (agent request)    ...host.h01.report
...host.<host>.sync                         HostSync (agent request)      ...host.h01.sync
...host.<host>.util                         HostUtilization (request)     ...host.h01.util
...hosts.report                             PartReports (request)         (services only)
...host.<host>.work                         HostWork (agent subscribes)   ...host.h01.work
...host.<host>.state                        HostDraining/Drained/Healthy  ...host.*.state
...events.<a>.<w>.<event>                   Workload* lifecycle events    ...events.nlp.>
...preempt.<a>.<w>                          PreemptionNotice              ...preempt.nlp.*
...queued.<a>.<w>                           WorkloadQueued (not logged)   ...queued.nlp.*
...watch.<a>                                WatchLog (request)            ...watch.nlp
...watched.<a>.<deliver>                    records of a watch            ...watched.nlp.*
...ranking                                  RankingUpdated                ...ranking
...leader                                   LeaderElected                 (services only)
...budget.tree                              BudgetTreeSet (current tree)  ...budget.tree
...usage.gpu.<host>                         HostUtilizationRecorded       (services only)
...usage.idle.<a>.<w>                       WorkloadFlaggedIdle/Cleared   ...usage.idle.nlp.*
...query.{queue,prio,hosts,share,...}       queries (request/reply)       ...query.*
==========================================  ============================  ==========================

(``...`` abbreviates ``allot.v1.``; ``<a>`` is an allocation, ``<w>`` a workload id and
``<login>`` the sender's NATS login.)

Rules behind the shape:

1. **Unallocated work** uses the token ``~`` (``UNALLOCATED``) in place of the allocation.
   ``~`` is outside the budget-name alphabet, so no allocation can collide with it. Work
   submitted to an allocation with ``min_runtime_s`` 0 runs unallocated (charged to nobody)
   but every subject of it, its preemption notices included, keeps that allocation's token.
2. **Budgets**: the subject carries the *full path from the root* to the node whose shares
   change, one token per level (``allot.v1.budget.set.root.nlp.pretrain`` sets the shares
   of ``pretrain`` under ``nlp``). The manager ``lead`` of ``nlp`` is granted
   ``allot.v1.budget.set.by.lead.root.nlp.>`` (rule 6): NATS's ``>`` matches one or more
   tokens, so the grant covers every node strictly below ``nlp`` and never ``nlp`` itself
   (a manager cannot raise their own share; their parent's manager can). The payload
   repeats the path; the service rejects a payload whose path differs from the subject's.
3. **Hosts**: the host is the fourth token and the kind the fifth, so ``allot.v1.host.h01.>``
   is everything about host ``h01``. An agent is granted the *literal* subjects
   ``...h01.heartbeat``, ``...h01.health``, ``...h01.report`` and ``...h01.sync`` to
   publish and ``...h01.work`` to read (not ``h01.>``: that would include drain);
   operator ``ops`` gets ``allot.v1.host.*.drain.ops`` and ``...undrain.ops``. Agents never
   read the log: the dispatch service tells each host what to run (``work``) and turns
   its primary part's reports into log records after checking the host is that part's.
4. **Workloads**: events and notices are addressed ``<allocation>.<workload>``, so a team
   subscribes to ``allot.v1.preempt.<allocation>.*`` and a training loop to
   ``allot.v1.preempt.<allocation>.<workload>``. A lifecycle event's subject ends with what
   happened (``EVENT_NAMES``: ``...events.nlp.w1.placed``), so a reader that needs only some
   events has the server filter them: accounting's consumer reads ``started`` and the
   endings (``CHARGED_EVENTS``), not the submissions and placements, half of the log at
   500 submissions/s; ``...events.nlp.w1.*`` is one workload's every event and
   ``...events.nlp.>`` an allocation's. Each record type has one name
   (``allot.proto.messages.EVENT_NAME``), and readers refuse a record filed under another
   (``allot.bus.decode_record``), so a filtered reader never misses one.
5. **Reading the log**: only services use the JetStream API. A team asks on
   ``allot.v1.watch.<allocation>`` and the service creates the consumer (filter: that
   allocation's workload; delivery: ``allot.v1.watched.<allocation>.<deliver>``, which only
   that allocation's team may read); see ``allot.bus.log_watch``.
6. Commands are core-NATS requests answered by the service (no stream captures them, so a
   JetStream ack never races the service's reply); events go to the streams in ``STREAMS``.
6. **Identities come from logins.** Every command that records a person's name has an
   *identity form* whose subject carries the sender's NATS login as a token (``<login>``
   above; ``login_of`` reads it): the submission's and the cancel's ``user``, the budget
   change's ``set_by``, the drain's ``operator``. The service refuses a payload whose name
   differs from that token (``check_login``), and ``allot auth gen`` grants each login only
   its own token, literally, so under auth the name in the log is the login that sent it.
   The bare forms (no login token) stay for the no-auth stack and old clients; no person
   is granted them. A budget change's login comes before the path (``by.<login>.root...``)
   because the path has variable depth; a cancel's form (``user``, ``operator``,
   ``manager``) before the login, so the bare on-behalf forms stay one token shorter.
7. **GPU utilization**: an agent reports its host's GPUs on ``...host.<h>.util`` (a
   request the health service answers); health records what it judged on
   ``...usage.gpu.<h>`` and flags idle allocated work on ``...usage.idle.<a>.<w>`` (both in
   USAGE), where the allocation's team, granted ``...usage.idle.<a>.*``, hears it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum

from allot.core.errors import ValidationError

PREFIX = "allot.v1"
MAX_TOKEN_LEN = 64
"""Longest name accepted as a subject token (also the wire limit on names and ids)."""
MAX_BUDGET_DEPTH = 100
"""Deepest budget path (``allot.core.budgets.MAX_DEPTH`` levels below the root)."""
UNALLOCATED = "~"
"""The allocation token of unallocated (free, never charged) work."""
BUDGET_ROOT = "root"

_BAD_TOKEN = re.compile(r"[.*>\s]")


class Kind(StrEnum):
    """What a subject carries; ``allot.proto.codec.decode`` takes one of these."""

    SUBMIT = "submit"
    CANCEL = "cancel"
    OPERATOR_CANCEL = "cancel.operator"
    MANAGER_CANCEL = "cancel.manager"
    BUDGET_SET = "budget.set"
    HEARTBEAT = "host.heartbeat"
    HEALTH = "host.health"
    HOST_REPORT = "host.report"
    HOST_SYNC = "host.sync"
    HOST_UTIL = "host.util"
    HOSTS_REPORT = "hosts.report"
    HOST_WORK = "host.work"
    DRAIN = "host.drain"
    UNDRAIN = "host.undrain"
    HOST_STATE = "host.state"
    EVENTS = "events"
    QUEUED = "queued"
    PREEMPT = "preempt"
    RANKING = "ranking"
    LEADER = "leader"
    BUDGET_TREE = "budget.tree"
    USAGE_GPU = "usage.gpu"
    IDLE = "usage.idle"
    WATCH = "watch"
    WATCHED = "watched"
    SUBMIT_AS = "submit.as"
    CANCEL_AS = "cancel.as"
    OPERATOR_CANCEL_AS = "cancel.operator.as"
    MANAGER_CANCEL_AS = "cancel.manager.as"
    BUDGET_SET_AS = "budget.set.as"
    DRAIN_AS = "host.drain.as"
    UNDRAIN_AS = "host.undrain.as"


IDENTITY_FORMS: dict[Kind, Kind] = {
    Kind.SUBMIT_AS: Kind.SUBMIT,
    Kind.CANCEL_AS: Kind.CANCEL,
    Kind.OPERATOR_CANCEL_AS: Kind.OPERATOR_CANCEL,
    Kind.MANAGER_CANCEL_AS: Kind.MANAGER_CANCEL,
    Kind.BUDGET_SET_AS: Kind.BUDGET_SET,
    Kind.DRAIN_AS: Kind.DRAIN,
    Kind.UNDRAIN_AS: Kind.UNDRAIN,
}
"""Each identity form (the sender's login in the subject, rule 6) -> its bare form, which
carries the same message."""


def validate_token(name: str, field: str) -> str:
    """Return ``name`` if it can be one subject token, else raise ``ValidationError(field)``."""
    if not isinstance(name, str):
        raise ValidationError(field, f"must be a string, got {type(name).__name__}")
    if not name:
        raise ValidationError(field, "must not be empty (it becomes a NATS subject token)")
    if len(name) > MAX_TOKEN_LEN:
        raise ValidationError(
            field, f"is {len(name)} characters long; a subject token allows {MAX_TOKEN_LEN}"
        )
    bad = _BAD_TOKEN.search(name)
    if bad is not None:
        raise ValidationError(
            field,
            f"{name!r} contains {bad.group()!r}; a NATS subject token may not contain "
            "'.', '*', '>' or whitespace",
        )
    return name


def allocation_token(allocation: str | None) -> str:
    """The subject token of an allocation: its name, or ``~`` for unallocated work."""
    if allocation is None:
        return UNALLOCATED
    return validate_token(allocation, "allocation")


# -- commands ---------------------------------------------------------------------------------


def submit(allocation: str | None) -> str:
    return f"{PREFIX}.submit.{allocation_token(allocation)}"


def cancel(allocation: str | None, workload: str) -> str:
    return f"{PREFIX}.cancel.{allocation_token(allocation)}.{validate_token(workload, 'workload')}"


def operator_cancel(allocation: str | None, workload: str) -> str:
    """An operator's cancel of anyone's workload (``scancel`` as root): a subject of its
    own, one token longer than the owner's, so a team's ``cancel.<a>.*`` never grants it."""
    return f"{cancel(allocation, workload)}.{OPERATOR}"


OPERATOR = "operator"


def manager_cancel(allocation: str | None, workload: str) -> str:
    """A budget manager's cancel of a workload of an allocation in its subtree (as a Slurm
    account coordinator's ``scancel``): ``allot auth gen`` grants it per allocation."""
    return f"{cancel(allocation, workload)}.{MANAGER}"


MANAGER = "manager"
ON_BEHALF = (OPERATOR, MANAGER)
"""The last token of a cancel sent for someone else's workload, by who may send it."""
OWNER = "user"
"""The form token of an owner's cancel in its identity form (``...<w>.user.<login>``)."""
CANCEL_FORMS = (OWNER, *ON_BEHALF)


def login_token(login: str) -> str:
    """The subject token of a sender's login (``ValidationError("user")`` if it cannot be one)."""
    return validate_token(login, "user")


def submit_as(allocation: str | None, login: str) -> str:
    """A submission sent as ``login``: the payload's ``user`` must be ``login`` (rule 6)."""
    return f"{submit(allocation)}.{login_token(login)}"


def cancel_as(allocation: str | None, workload: str, login: str, form: str = OWNER) -> str:
    """A cancel sent as ``login``, in ``form`` (``OWNER``, ``OPERATOR`` or ``MANAGER``):
    the payload's ``user`` must be ``login``. ``allot auth gen`` grants a team member
    ``...cancel.<a>.*.user.<login>``, an operator ``...cancel.*.*.operator.<login>``, a
    manager ``...cancel.<a>.*.manager.<login>`` per allocation of its subtree."""
    if form not in CANCEL_FORMS:
        raise ValidationError("form", f"must be one of {', '.join(CANCEL_FORMS)}, got {form!r}")
    return f"{cancel(allocation, workload)}.{form}.{login_token(login)}"


def budget_set(path: Sequence[str]) -> str:
    """``path`` runs from ``root`` down to the node whose shares change (root excluded as a
    target: the root has no shares)."""
    if isinstance(path, str):
        raise ValidationError("path", "must be a sequence of node names, not one string")
    if len(path) < 2 or path[0] != BUDGET_ROOT:
        raise ValidationError(
            "path", f"must start at {BUDGET_ROOT!r} and name at least one node below it"
        )
    if len(path) > MAX_BUDGET_DEPTH + 1:
        raise ValidationError("path", f"is deeper than {MAX_BUDGET_DEPTH} levels")
    tokens = [validate_token(p, f"path[{i}]") for i, p in enumerate(path)]
    return f"{PREFIX}.budget.set.{'.'.join(tokens)}"


BUDGET_BY = "by"
"""The token before the login in a budget change's identity form."""
_BUDGET_SET = f"{PREFIX}.budget.set."


def budget_set_as(path: Sequence[str], login: str) -> str:
    """A budget change sent as ``login``: ``allot.v1.budget.set.by.<login>.root...``; the
    payload's ``set_by`` must be ``login``. The login comes first: the path's depth varies."""
    bare = budget_set(path)
    return f"{_BUDGET_SET}{BUDGET_BY}.{login_token(login)}.{bare.removeprefix(_BUDGET_SET)}"


def budget_subtree(path: Sequence[str], login: str | None = None) -> str:
    """The grant for the manager of the node at ``path``: every node strictly below it (in
    the identity form of ``login`` when given)."""
    if isinstance(path, str) or not path or path[0] != BUDGET_ROOT:
        raise ValidationError("path", f"must start at {BUDGET_ROOT!r}")
    tokens = [validate_token(p, f"path[{i}]") for i, p in enumerate(path)]
    by = "" if login is None else f"{BUDGET_BY}.{login_token(login)}."
    return f"{_BUDGET_SET}{by}{'.'.join(tokens)}.>"


def budget_path_of(subject: str) -> tuple[str, ...]:
    """The budget path a budget change's subject names, in either form."""
    tokens = subject.removeprefix(_BUDGET_SET).split(".")
    return tuple(tokens[2:] if tokens[0] == BUDGET_BY else tokens)


def login_of(subject: str) -> str | None:
    """The sender's login in a command's identity form (rule 6); None in a bare form or any
    other subject."""
    try:
        kind = kind_of(subject)
    except ValidationError:
        return None
    if kind not in IDENTITY_FORMS:
        return None
    tokens = subject.split(".")
    return tokens[5] if kind is Kind.BUDGET_SET_AS else tokens[-1]


def check_login(field: str, name: str, login: str | None) -> None:
    """Raise ``ValidationError(field)`` when a payload's name for its sender (a
    submission's ``user``, ``set_by``, ``operator``) differs from the subject's login; a
    bare form (``login`` None) checks nothing."""
    if login is not None and name != login:
        raise ValidationError(field, f"{name!r} differs from the login {login!r}")


def _host_subject(host: str, kind: str) -> str:
    return f"{PREFIX}.host.{validate_token(host, 'host')}.{kind}"


def host_of(subject: str) -> str:
    """``allot.v1.host.<host>.<kind>`` -> ``<host>``: who speaks, by the subject NATS let
    them publish on (the caller's subscription guarantees the shape)."""
    return subject.split(".")[3]


def check_host(payload_host: str, subject_host: str) -> None:
    """Raise ``ValidationError("host")`` when a payload names another host than its subject
    (identity comes from the subject, never from a payload field)."""
    if payload_host != subject_host:
        raise ValidationError(
            "host", f"{payload_host!r} differs from the subject's host {subject_host!r}"
        )


def heartbeat(host: str) -> str:
    return _host_subject(host, "heartbeat")


def health(host: str) -> str:
    return _host_subject(host, "health")


def host_report(host: str) -> str:
    return _host_subject(host, "report")


def host_sync(host: str) -> str:
    return _host_subject(host, "sync")


def host_work(host: str) -> str:
    return _host_subject(host, "work")


def host_util(host: str) -> str:
    """Where a host's agent reports its GPUs' utilization (``HostUtilization``)."""
    return _host_subject(host, "util")


def drain(host: str) -> str:
    return _host_subject(host, "drain")


def undrain(host: str) -> str:
    return _host_subject(host, "undrain")


def drain_as(host: str, login: str) -> str:
    """A drain sent as ``login``: the payload's ``operator`` must be ``login``."""
    return f"{drain(host)}.{login_token(login)}"


def undrain_as(host: str, login: str) -> str:
    return f"{undrain(host)}.{login_token(login)}"


# -- events -----------------------------------------------------------------------------------


def host_state(host: str) -> str:
    return _host_subject(host, "state")


REQUEST_ID_HEADER = "Allot-Request"
"""A request's own id, the same on every retry of it (the SDK sets it): a submission that an
earlier attempt of the same request stored is answered as accepted, not as a duplicate."""

EVENT_NAMES: tuple[str, ...] = (
    "submitted",
    "cancel_requested",
    "placed",
    "started",
    "preempted",
    "requeued",
    "completed",
    "failed",
    "cancelled",
)
"""The last token of a lifecycle event's subject: what happened (one per record type, see
``allot.proto.messages.EVENT_NAME``)."""

CHARGED_EVENTS: tuple[str, ...] = ("started", "preempted", "completed", "failed", "cancelled")
"""The events that start or end a charged run: all that accounting reads."""


def _event_token(event: str) -> str:
    if event not in EVENT_NAMES:
        raise ValidationError("event", f"must be one of {', '.join(EVENT_NAMES)}, got {event!r}")
    return event


def _workload_subject(allocation: str | None, workload: str, last: str) -> str:
    workload = validate_token(workload, "workload")
    return f"{PREFIX}.events.{allocation_token(allocation)}.{workload}.{last}"


def events(allocation: str | None, workload: str, event: str) -> str:
    """Where a workload's lifecycle ``event`` (one of ``EVENT_NAMES``) is logged."""
    return _workload_subject(allocation, workload, _event_token(event))


def workload_events(allocation: str | None, workload: str) -> str:
    """Every lifecycle event of one workload."""
    return _workload_subject(allocation, workload, "*")


def every_workload(event: str) -> str:
    """Every workload's ``event`` (one of ``EVENT_NAMES``): ``allot.v1.events.*.*.<event>``."""
    return f"{PREFIX}.events.*.*.{_event_token(event)}"


def event_name(subject: str) -> str:
    """The event a lifecycle event's subject names (its last token)."""
    return subject.rsplit(".", 1)[-1]


def queued(allocation: str | None, workload: str) -> str:
    """Queue positions: derived, re-published as the queue moves, so core NATS only (not in
    the log: a lost one is just stale, and the log stays the record of what happened)."""
    return f"{PREFIX}.queued.{allocation_token(allocation)}.{validate_token(workload, 'workload')}"


def preempt(allocation: str | None, workload: str) -> str:
    return f"{PREFIX}.preempt.{allocation_token(allocation)}.{validate_token(workload, 'workload')}"


def watch(allocation: str | None) -> str:
    """Where a team asks the services to read the log for it (``WatchLog``)."""
    return f"{PREFIX}.watch.{allocation_token(allocation)}"


def watched(allocation: str | None, deliver: str) -> str:
    """Where the records of one watch are delivered: ``deliver`` is the watcher's own token."""
    return f"{PREFIX}.watched.{allocation_token(allocation)}.{validate_token(deliver, 'deliver')}"


def usage_gpu(host: str) -> str:
    """Where the health service records a host's judged utilization (USAGE)."""
    return f"{PREFIX}.usage.gpu.{validate_token(host, 'host')}"


def idle(allocation: str, workload: str) -> str:
    """Where a run of ``allocation``'s is flagged idle and cleared (USAGE)."""
    a = validate_token(allocation, "allocation")
    return f"{PREFIX}.usage.idle.{a}.{validate_token(workload, 'workload')}"


def allocation_idle(allocation: str) -> str:
    """Every idle flag of one allocation's workloads: what its team is granted to read."""
    return f"{PREFIX}.usage.idle.{validate_token(allocation, 'allocation')}.*"


def allocation_watched(allocation: str | None) -> str:
    """Every watch delivery of one allocation: what its team is granted to read."""
    return f"{PREFIX}.watched.{allocation_token(allocation)}.*"


def query_scoped(query: str, allocation: str | None) -> str:
    """``QUERY_QUEUE``, ``QUERY_PRIO``, ``QUERY_STATUS`` or ``QUERY_IDLE`` for one
    allocation's work only (``~``: unallocated work): ``allot.v1.query.queue.nlp``."""
    if query not in (QUERY_QUEUE, QUERY_PRIO, QUERY_STATUS, QUERY_IDLE):
        raise ValidationError("query", f"has no per-allocation form: {query!r}")
    return f"{query}.{allocation_token(allocation)}"


RANKING = f"{PREFIX}.ranking"
LEADER = f"{PREFIX}.leader"
BUDGET_TREE = f"{PREFIX}.budget.tree"

# -- queries (core-NATS request/reply; payload ``{}`` unless noted) --------------------------

QUERY_QUEUE = f"{PREFIX}.query.queue"
"""QueueSnapshot, answered by the placement leader."""
QUERY_PRIO = f"{PREFIX}.query.prio"
"""PrioSnapshot (``allot prio``), answered by the placement leader."""
QUERY_HOSTS = f"{PREFIX}.query.hosts"
"""HostsQuery (or an empty body or ``{}``: the first page) -> HostsSnapshot, one page of hosts in id
order, or CommandRejected; answered by the placement leader."""
QUERY_STATUS = f"{PREFIX}.query.status"
"""StatusQuery -> WorkloadStatus, answered by the placement leader."""
QUERY_SHARE = f"{PREFIX}.query.share"
"""RankingUpdated (the latest), answered by the ranking service."""
QUERY_INTAKE = f"{PREFIX}.query.intake"
"""An empty body -> CommandAccepted, answered by intake once it serves submissions (on their
connection, after them): what the stack's readiness asks."""
ALL_QUERY_QUEUE = f"{QUERY_QUEUE}.*"
ALL_QUERY_PRIO = f"{QUERY_PRIO}.*"
ALL_QUERY_STATUS = f"{QUERY_STATUS}.*"
"""Per-allocation forms, answered by the placement leader with that allocation's rows (a
status only when the workload belongs to it): what a team is granted (``query_scoped``)."""
QUERY_ALLOCATIONS = f"{PREFIX}.query.allocations"
"""AllocationsSnapshot (held vs entitlement per allocation), answered by the placement leader."""
QUERY_PLACEMENT_STATS = f"{PREFIX}.query.placement_stats"
"""PlacementStats (scheduling-cycle durations), answered by the placement leader."""
QUERY_OWED = f"{PREFIX}.query.owed"
"""OwedQuery -> OwedSnapshot or CommandRejected, answered by the dashboard service."""
QUERY_IDLE = f"{PREFIX}.query.idle"
"""IdleSnapshot: the runs flagged idle now, answered by the health service; the
per-allocation form ``...query.idle.<a>`` (``query_scoped``) lists that allocation's."""
ALL_QUERY_IDLE = f"{QUERY_IDLE}.*"
QUERY_USAGE = f"{PREFIX}.query.usage"
"""UsageQuery (or an empty body) -> UsageSnapshot or CommandRejected: the GPU-seconds charged
to each allocation, answered by the accounting service."""
QUERY_HISTORY = f"{PREFIX}.query.history"
"""HistoryQuery -> HistoryPage or CommandRejected: one page of a log stream, answered by the
ranking service (operators and managers: ``allot export``, ``whatif``, ``budgets history``)."""
DASHBOARD_LOG = f"{PREFIX}.dashboard.log"
"""HistoryQuery -> HistoryPage or CommandRejected as ``QUERY_HISTORY``: the dashboard's own
reads of the log (it reads it only this way), answered by the ranking service in slots of
their own, so that no login asking ``QUERY_HISTORY`` can hold the dashboard's view back;
granted to the dashboard's login and the services only."""

# -- wildcards (subscriptions and grants) -----------------------------------------------------

ALL_SUBMIT = f"{PREFIX}.submit.*"
ALL_CANCEL = f"{PREFIX}.cancel.*.*"
ALL_OPERATOR_CANCEL = f"{PREFIX}.cancel.*.*.{OPERATOR}"
ALL_MANAGER_CANCEL = f"{PREFIX}.cancel.*.*.{MANAGER}"
ALL_BUDGET_SET = f"{PREFIX}.budget.set.>"
"""Both forms of a budget change (the bare path, and ``by.<login>.`` before it)."""
ALL_SUBMIT_AS = f"{PREFIX}.submit.*.*"
ALL_CANCEL_AS = f"{PREFIX}.cancel.*.*.{OWNER}.*"
ALL_OPERATOR_CANCEL_AS = f"{PREFIX}.cancel.*.*.{OPERATOR}.*"
ALL_MANAGER_CANCEL_AS = f"{PREFIX}.cancel.*.*.{MANAGER}.*"
ALL_HEARTBEATS = f"{PREFIX}.host.*.heartbeat"
ALL_HEALTH = f"{PREFIX}.host.*.health"
ALL_HOST_REPORT = f"{PREFIX}.host.*.report"
ALL_HOST_SYNC = f"{PREFIX}.host.*.sync"
ALL_HOST_UTIL = f"{PREFIX}.host.*.util"
ALL_USAGE_GPU = f"{PREFIX}.usage.gpu.*"
ALL_IDLE = f"{PREFIX}.usage.idle.*.*"
HOSTS_REPORT = f"{PREFIX}.hosts.report"
"""Many hosts' reports in one request (``PartReports``): a fake agent's, for any host, so
only users granted every subject (services) may send it."""
ALL_DRAIN = f"{PREFIX}.host.*.drain"
ALL_UNDRAIN = f"{PREFIX}.host.*.undrain"
ALL_DRAIN_AS = f"{PREFIX}.host.*.drain.*"
ALL_UNDRAIN_AS = f"{PREFIX}.host.*.undrain.*"
ALL_HOST_STATE = f"{PREFIX}.host.*.state"
ALL_EVENTS = f"{PREFIX}.events.*.*.*"
ALL_PREEMPT = f"{PREFIX}.preempt.*.*"
ALL_QUEUED = f"{PREFIX}.queued.*.*"
ALL_WATCH = f"{PREFIX}.watch.*"

RUNS_WITHOUT_STARTS: tuple[str, ...] = (
    *(every_workload(e) for e in EVENT_NAMES if e != "started"),
    ALL_PREEMPT,
    LEADER,
)
"""Everything of WORKLOADS but runs' starts, for a follower whose fold decides nothing on
them (placement: protection counts from the placement; health's idle watch: a run's GPUs
are its placement's). A server before 2.10 ignores several filters and delivers starts too
(``bus.takes_several_filters``); ``LogFold`` takes them either way."""

RUNS_FROM_PLACEMENTS: tuple[str, ...] = tuple(
    subject for subject in RUNS_WITHOUT_STARTS if subject != every_workload("submitted")
)
"""``RUNS_WITHOUT_STARTS`` without submissions either, for a follower that needs which run
holds which GPUs but not what was asked (health's idle watch: a placement says the run's
allocation, GPUs and protection; ``IdleWatch.apply`` stands in for the submission)."""


def allocation_events(allocation: str | None) -> str:
    """Every lifecycle event of one allocation's workloads."""
    return f"{PREFIX}.events.{allocation_token(allocation)}.>"


def allocation_preempt(allocation: str | None) -> str:
    """Every preemption notice of one allocation's workloads."""
    return f"{PREFIX}.preempt.{allocation_token(allocation)}.*"


def allocation_queued(allocation: str | None) -> str:
    """Every queue position of one allocation's workloads."""
    return f"{PREFIX}.queued.{allocation_token(allocation)}.*"


def host_all(host: str) -> str:
    """Everything about one host."""
    return f"{PREFIX}.host.{validate_token(host, 'host')}.>"


CHANNELS: dict[Kind, str] = {
    Kind.SUBMIT: f"{PREFIX}.submit.{{allocation}}",
    Kind.CANCEL: f"{PREFIX}.cancel.{{allocation}}.{{workload}}",
    Kind.OPERATOR_CANCEL: f"{PREFIX}.cancel.{{allocation}}.{{workload}}.{OPERATOR}",
    Kind.MANAGER_CANCEL: f"{PREFIX}.cancel.{{allocation}}.{{workload}}.{MANAGER}",
    Kind.BUDGET_SET: f"{PREFIX}.budget.set.{{path}}",
    Kind.HEARTBEAT: f"{PREFIX}.host.{{host}}.heartbeat",
    Kind.HEALTH: f"{PREFIX}.host.{{host}}.health",
    Kind.HOST_REPORT: f"{PREFIX}.host.{{host}}.report",
    Kind.HOST_SYNC: f"{PREFIX}.host.{{host}}.sync",
    Kind.HOST_UTIL: f"{PREFIX}.host.{{host}}.util",
    Kind.HOSTS_REPORT: HOSTS_REPORT,
    Kind.HOST_WORK: f"{PREFIX}.host.{{host}}.work",
    Kind.DRAIN: f"{PREFIX}.host.{{host}}.drain",
    Kind.UNDRAIN: f"{PREFIX}.host.{{host}}.undrain",
    Kind.HOST_STATE: f"{PREFIX}.host.{{host}}.state",
    Kind.EVENTS: f"{PREFIX}.events.{{allocation}}.{{workload}}.{{event}}",
    Kind.PREEMPT: f"{PREFIX}.preempt.{{allocation}}.{{workload}}",
    Kind.QUEUED: f"{PREFIX}.queued.{{allocation}}.{{workload}}",
    Kind.RANKING: RANKING,
    Kind.LEADER: LEADER,
    Kind.BUDGET_TREE: BUDGET_TREE,
    Kind.USAGE_GPU: f"{PREFIX}.usage.gpu.{{host}}",
    Kind.IDLE: f"{PREFIX}.usage.idle.{{allocation}}.{{workload}}",
    Kind.WATCH: f"{PREFIX}.watch.{{allocation}}",
    Kind.WATCHED: f"{PREFIX}.watched.{{allocation}}.{{deliver}}",
    Kind.SUBMIT_AS: f"{PREFIX}.submit.{{allocation}}.{{login}}",
    Kind.CANCEL_AS: f"{PREFIX}.cancel.{{allocation}}.{{workload}}.{OWNER}.{{login}}",
    Kind.OPERATOR_CANCEL_AS: f"{PREFIX}.cancel.{{allocation}}.{{workload}}.{OPERATOR}.{{login}}",
    Kind.MANAGER_CANCEL_AS: f"{PREFIX}.cancel.{{allocation}}.{{workload}}.{MANAGER}.{{login}}",
    Kind.BUDGET_SET_AS: f"{PREFIX}.budget.set.{BUDGET_BY}.{{login}}.{{path}}",
    Kind.DRAIN_AS: f"{PREFIX}.host.{{host}}.drain.{{login}}",
    Kind.UNDRAIN_AS: f"{PREFIX}.host.{{host}}.undrain.{{login}}",
}
"""Subject templates per kind (AsyncAPI channel addresses)."""

STREAMS: dict[str, tuple[str, ...]] = {
    "WORKLOADS": (ALL_EVENTS, ALL_PREEMPT, LEADER),
    "HOSTS": (ALL_HOST_STATE,),
    "USAGE": (f"{PREFIX}.usage.>", RANKING, BUDGET_TREE),
}
"""JetStream streams, one per concern, and the subjects each captures. Commands and
heartbeats are not captured: services answer them and append what they decide."""


def matches(pattern: str, subject: str) -> bool:
    """NATS wildcards: ``*`` is one token, a final ``>`` one or more."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


def stream_holds(stream: str, subject: str) -> bool:
    """Whether ``subject`` is one ``stream`` captures (``STREAMS``). A record read from a
    stream on a subject it does not capture was delivered into it from elsewhere (a reply
    subject steered onto the stream keeps the record's own subject: decision 0085)."""
    return any(matches(p, subject) for p in STREAMS.get(stream, ()))


ACCOUNTING_DURABLE = "accounting"
"""The accounting service's durable consumer on WORKLOADS."""
SERVICE_DURABLES: tuple[str, ...] = (ACCOUNTING_DURABLE,)
"""Every durable consumer the services own (``allot auth gen`` denies them to everyone
else by name, beside the whole JetStream API)."""
_CANCEL_AS = {
    OWNER: Kind.CANCEL_AS,
    OPERATOR: Kind.OPERATOR_CANCEL_AS,
    MANAGER: Kind.MANAGER_CANCEL_AS,
}


def kind_of(subject: str) -> Kind:
    """The kind of a concrete subject (raises ``ValidationError("subject")`` if unknown)."""
    parts = subject.split(".")
    if len(parts) < 3 or ".".join(parts[:2]) != PREFIX:
        raise ValidationError("subject", f"{subject!r} is not an {PREFIX} subject")
    rest = parts[2:]
    head, n = rest[0], len(rest)
    if head == "submit" and n in (2, 3):
        return Kind.SUBMIT if n == 2 else Kind.SUBMIT_AS
    if head == "cancel" and n == 3:
        return Kind.CANCEL
    if head == "cancel" and n == 4 and rest[3] in ON_BEHALF:
        return Kind.OPERATOR_CANCEL if rest[3] == OPERATOR else Kind.MANAGER_CANCEL
    if head == "cancel" and n == 5 and rest[3] in CANCEL_FORMS:
        return _CANCEL_AS[rest[3]]
    if head == "budget" and n >= 6 and rest[1:3] == ["set", BUDGET_BY] and rest[4] == BUDGET_ROOT:
        return Kind.BUDGET_SET_AS
    if head == "budget" and n >= 4 and rest[1] == "set" and rest[2] != BUDGET_BY:
        return Kind.BUDGET_SET
    if head == "host" and n == 3:
        try:
            return Kind(f"host.{rest[2]}")
        except ValueError:
            pass
    if head == "host" and n == 4 and rest[2] in ("drain", "undrain"):
        return Kind.DRAIN_AS if rest[2] == "drain" else Kind.UNDRAIN_AS
    if head == "hosts" and n == 2 and rest[1] == "report":
        return Kind.HOSTS_REPORT
    if head == "events" and n == 4 and rest[3] in EVENT_NAMES:
        return Kind.EVENTS
    if head == "preempt" and n == 3:
        return Kind.PREEMPT
    if head == "queued" and n == 3:
        return Kind.QUEUED
    if head == "watch" and n == 2:
        return Kind.WATCH
    if head == "watched" and n == 3:
        return Kind.WATCHED
    if head == "ranking" and n == 1:
        return Kind.RANKING
    if head == "leader" and n == 1:
        return Kind.LEADER
    if head == "budget" and n == 2 and rest[1] == "tree":
        return Kind.BUDGET_TREE
    if head == "usage" and n == 3 and rest[1] == "gpu":
        return Kind.USAGE_GPU
    if head == "usage" and n == 4 and rest[1] == "idle":
        return Kind.IDLE
    raise ValidationError("subject", f"{subject!r} is not a known {PREFIX} subject")
