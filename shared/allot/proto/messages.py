"""Wire messages, version 1: one frozen, tagged ``msgspec.Struct`` per command and event.

Commands are imperative (``SubmitWorkload``), events past tense (``WorkloadPlaced``). Every
message is JSON with a ``"type"`` field holding the class name (msgspec's ``tag=True``;
required: ``codec`` refuses a message without it, a batch's items included), and
unknown fields are rejected (``forbid_unknown_fields=True``), so a typo is an error rather
than a silently dropped setting.

Evolution rules (STYLE rule 8): a field added later always gets a default, no field changes
type, a message is never renamed; an incompatible change is a new subject version
(``allot.v2``). The committed ``proto/schema.json`` pins the shapes (a test fails on drift).

Ranges (``Meta`` constraints, checked on decode):

* names and ids (allocation, user, host, workload, client_id, budget nodes):
  ``[A-Za-z0-9_-]``, 1..64 characters: they become NATS subject tokens;
* ``gpus``: 1..``MAX_GPUS``; ``min_runtime_s``: 0..28800 (8 h, the core's
  ``MAX_MIN_RUNTIME_S``; a test keeps the two equal);
* times: seconds since the Unix epoch, as floats in [0, 1e11]; durations in seconds;
* free text (reasons, details): at most 1024 characters.

JSON has no NaN or infinity: msgspec rejects ``NaN`` and ``1e999``. Fair Tree's infinite
level fairshare (an idle node with shares) travels as the string ``"inf"``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

MAX_NAME_LEN = 64
MAX_GPUS = 16_384
"""Wire ceiling on one workload's GPUs; the cluster's size is checked by intake."""
MAX_MIN_RUNTIME_S = 28_800
"""8 hours: the contract's ceiling on the protected window (equal to the core's)."""
MAX_TEXT_LEN = 1024
MAX_BUDGET_DEPTH = 100
MAX_SHARES = 1_000_000
MAX_TIME = 1e11
MAX_QUEUE_ROWS = 2000
"""Rows in one ``QueueSnapshot`` reply (about 300 bytes each, under NATS's 1 MiB)."""

NAME_PATTERN = r"^[A-Za-z0-9_-]+(?!\n)$"
"""Anchored at both ends; the lookahead stops Python's ``$`` from accepting a final newline."""

Name = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_NAME_LEN,
        pattern=NAME_PATTERN,
        description="letters, digits, '_' and '-' (a NATS subject token)",
    ),
]
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_LEN)]
Gpus = Annotated[int, msgspec.Meta(ge=1, le=MAX_GPUS, description="GPUs, at least one")]
GpuCount = Annotated[int, msgspec.Meta(ge=0, le=10 * MAX_GPUS)]
GpuIndex = Annotated[int, msgspec.Meta(ge=0, le=1023)]
MinRuntime = Annotated[
    int,
    msgspec.Meta(
        ge=0,
        le=MAX_MIN_RUNTIME_S,
        description="protected window in seconds, 0..28800 (8 h); 0 means unallocated",
    ),
]
Timestamp = Annotated[
    float, msgspec.Meta(ge=0.0, le=MAX_TIME, description="seconds since the Unix epoch")
]
RunStart = Annotated[
    float,
    msgspec.Meta(
        ge=0.0,
        le=MAX_TIME,
        description="when the run's process started on its host, as its agent reported (the "
        "charge runs from it; the placement time when no start was reported), seconds since "
        "the Unix epoch",
    ),
]
PlacedAt = Annotated[
    float,
    msgspec.Meta(
        ge=0.0,
        le=MAX_TIME,
        description="when the current (or last) attempt was placed, Slurm's job start; its "
        "process starts later (run_started_at), seconds since the Unix epoch",
    ),
]
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TIME)]
NonNegative = Annotated[float, msgspec.Meta(ge=0.0, le=1e18)]
Priority = Annotated[int, msgspec.Meta(ge=-1000, le=1000)]
NO_NUL_PATTERN = r"^[^\x00]*$"
"""A command's argument or a variable's value: exec cannot pass a NUL byte (the host would
fail to start the run only after the work was placed, maybe preempting others for it)."""
Arg = Annotated[
    str, msgspec.Meta(max_length=4096, pattern=NO_NUL_PATTERN, description="no NUL byte")
]
Command = Annotated[tuple[Arg, ...], msgspec.Meta(max_length=256)]
"""A workload's command and arguments (the submission's, its record's, a host's task's)."""
MAX_ENV = 64
"""Variables one workload may set (``env``)."""
MAX_ENV_NAME_CHARS = 128
MAX_ENV_VALUE_CHARS = 4096
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(?!\n)$"
EnvName = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_ENV_NAME_CHARS,
        pattern=ENV_NAME_PATTERN,
        description="a POSIX environment variable name: letters, digits, '_', not a digit first",
    ),
]
ENV_VALUE_PATTERN = NO_NUL_PATTERN
EnvValue = Annotated[
    str,
    msgspec.Meta(
        max_length=MAX_ENV_VALUE_CHARS, pattern=ENV_VALUE_PATTERN, description="no NUL byte"
    ),
]
Env = Annotated[
    dict[EnvName, EnvValue],
    msgspec.Meta(
        max_length=MAX_ENV,
        description="environment variables the workload's processes get, as sbatch --export "
        "NAME=VALUE (names the agent sets, RESERVED_ENV, are refused)",
    ),
]
RESERVED_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "ALLOT_WORKLOAD_ID",
        "ALLOT_ALLOCATION",
        "ALLOT_ATTEMPT",
        "ALLOT_NATS_URL",
        "ALLOT_NATS_CA",
        "ALLOT_HOST",
        "ALLOT_HOSTS",
        "ALLOT_HOST_RANK",
        "ALLOT_NUM_HOSTS",
        "ALLOT_AGENT",
        "ALLOT_CHECKPOINT_DIR",
        "ALLOT_SESSION_DIR",
    }
)
"""What the agent sets itself (``allot.services.agent.gpu_exec.workload_env``): a workload's ``env``
may not name them (intake refuses it, naming ``env``), and the agent's values win anyway."""
Attempt = Annotated[int, msgspec.Meta(ge=1, le=1_000_000, description="1 for the first run")]
Epoch = Annotated[
    int, msgspec.Meta(ge=0, le=2**63 - 1, description="placement leader's term (fencing token)")
]

PreemptReason = Literal[
    "displaced-unallocated",
    "reclaimed-for-entitlement",
    "better-ranked",
    "host-drain",
    "higher-class",
    "reservation",
    "idle",
]
"""The core's ``allot.core.decisions.PreemptReason`` values (a test keeps them equal)."""

# -- checkpoint protocol on notice (issue 40; docs/decisions/0053) ------------------------------
CheckpointSignal = Literal["USR1", "USR2", "HUP", "INT", "QUIT", "ALRM", "WINCH", "CONT"]
"""Signals a workload may ask for before SIGTERM (by name, no ``SIG``): never TERM or KILL,
which the agent sends itself, nor STOP, which would freeze the checkpoint it asks for."""
CheckpointOutcome = Literal["done", "late", "missed"]
"""How a workload answered its notice: confirmed within its ``checkpoint_timeout_s``,
after it but before the SIGKILL, or never (docs/decisions/0053)."""
MAX_CHECKPOINT_DIR_LEN = 1024
CHECKPOINT_DIR_PATTERN = r"^/[^\x00]*(?!\n)$"
CheckpointDir = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_CHECKPOINT_DIR_LEN,
        pattern=CHECKPOINT_DIR_PATTERN,
        description="an absolute path on shared storage, inside the roots the agents allow",
    ),
]
CheckpointTimeout = Annotated[
    float,
    msgspec.Meta(
        gt=0.0,
        le=86_400.0,
        description="seconds the checkpoint may take after the notice, at most the grace period",
    ),
]
SESSION_KIND = "session"
"""``kind`` of an interactive session (``allot session start``): its state directory is
saved by the agent after a notice and restored at its next placement."""


class AttemptCheckpoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One preempted attempt's checkpoint, as its agent reported it (``allot status``).
    ``lost_gpu_seconds``: GPUs x (end - the last confirmed checkpoint, or the start)."""

    attempt: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
    outcome: CheckpointOutcome | None = None
    checkpointed_at: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TIME)] | None = None
    lost_gpu_seconds: Annotated[float, msgspec.Meta(ge=0.0, le=1e18)] = 0.0


# -- end of the checkpoint block ------------------------------------------------------------------


class _Wire(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
):
    """Shared options of every wire Struct (not itself a message)."""


class _Message(_Wire, frozen=True, kw_only=True, tag=True):
    """A top-level message: tagged with its class name in the ``type`` field."""


# == commands ==================================================================================


class SubmitWorkload(_Message, frozen=True, kw_only=True):
    """Ask for GPUs. ``client_id`` is the idempotency key (as ``armadactl``'s): submitting
    again with the same id and the same values returns the first answer and never queues a
    second workload; the same id with other values is refused, naming ``client_id``.
    ``allocation`` absent means the subject's (``allot.v1.submit.<allocation>...``; on
    ``allot.v1.submit.~...`` unallocated work: free, preemptible at any moment); given, it
    must be the subject's. Work is allocated (protected for ``min_runtime_s``, charged) only
    with an allocation and ``min_runtime_s > 0``; the answer says which (``allocated``,
    ``note``). ``user`` must be the login in the subject
    (``allot.v1.submit.<allocation>.<login>``)."""

    client_id: Name
    user: Name
    gpus: Gpus
    allocation: Name | None = None
    min_runtime_s: MinRuntime = 0
    resumable: bool = True
    kind: Name = "training"
    priority: Priority = 0
    command: Command = ()
    env: Env = {}
    """Environment variables for the workload's processes (``RESERVED_ENV`` excepted)."""
    duration_s: Annotated[float, msgspec.Meta(gt=0.0, le=MAX_TIME)] | None = None
    """Fake agents only: how long to pretend to run."""
    checkpoint_signal: CheckpointSignal | None = None
    """Issue 40: the signal the agent sends at a notice, before SIGTERM."""
    checkpoint_timeout_s: CheckpointTimeout | None = None
    """How long the checkpoint may take (at most the grace period; None: until the deadline)."""
    checkpoint_dir: CheckpointDir | None = None
    """Where checkpoints go (shared storage; None: a directory the agents manage)."""


MAX_BATCH = 256
"""Most workloads in one ``SubmitBatch`` (the body must also stay within 64 KiB)."""


class SubmitBatch(_Message, frozen=True, kw_only=True):
    """Many submissions in one request, as Armada's job-set submit or a Slurm job array.
    Each item is validated, deduplicated by its own ``client_id`` and answered on its own,
    in order (``SubmitBatchAnswered``); every item names the subject's allocation and, as
    every message, its ``type``."""

    workloads: Annotated[
        tuple[SubmitWorkload, ...], msgspec.Meta(min_length=1, max_length=MAX_BATCH)
    ]


class CancelWorkload(_Message, frozen=True, kw_only=True):
    """Cancel a pending or running workload. On ``allot.v1.cancel.<a>.<w>.user.<login>``
    only its owner (``user`` = the submission's user) may; on ``...<w>.operator.<login>``
    (granted to operators only) ``user`` names the operator, who may cancel anyone's; on
    ``...<w>.manager.<login>`` (granted to the managers of allocation ``a``'s subtrees)
    ``user`` names the manager, who may cancel the allocation's workloads. ``user`` must be
    the subject's login (the bare forms without one carry no check). ``allocation`` left
    out means the subject's."""

    workload_id: Name
    user: Name
    allocation: Name | None = None
    reason: Text = ""


class SetBudget(_Message, frozen=True, kw_only=True):
    """Set the shares of the node at ``path`` (from ``root`` down, root excluded as a target).
    ``shares`` null means Slurm's ``parent``. ``set_by`` must be the login in the subject
    (``allot.v1.budget.set.by.<login>.root...``)."""

    path: Annotated[tuple[Name, ...], msgspec.Meta(min_length=2, max_length=MAX_BUDGET_DEPTH + 1)]
    shares: Annotated[int, msgspec.Meta(ge=0, le=MAX_SHARES)] | None
    set_by: Name


class DrainHost(_Message, frozen=True, kw_only=True):
    """``operator`` must be the login in the subject (``allot.v1.host.<h>.drain.<login>``)."""

    host: Name
    operator: Name
    reason: Text = ""


class UndrainHost(_Message, frozen=True, kw_only=True):
    host: Name
    operator: Name


class Heartbeat(_Message, frozen=True, kw_only=True):
    host: Name
    sent_at: Timestamp
    seq: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    gpus: Gpus
    running: Annotated[tuple[Name, ...], msgspec.Meta(max_length=1024)] = ()


class HealthReport(_Message, frozen=True, kw_only=True):
    host: Name
    sent_at: Timestamp
    healthy: bool
    failed_gpus: Annotated[tuple[GpuIndex, ...], msgspec.Meta(max_length=1024)] = ()
    detail: Text = ""


UtilPct = Annotated[
    float, msgspec.Meta(ge=0.0, le=100.0, description="GPU utilization, percent 0..100")
]


class HostUtilization(_Message, frozen=True, kw_only=True):
    """``allot.v1.host.<host>.util`` (request, from the host's agent): the mean utilization
    of each of the host's GPUs over ``[since, sent_at]``, ``util[i]`` for GPU index ``i``
    (null: not read); one message per host per report interval. Answered
    ``CommandAccepted`` or ``CommandRejected`` naming the field (a time ahead of the
    clock, an interval too long, more GPUs than the host registered)."""

    host: Name
    since: Timestamp
    sent_at: Timestamp
    util: Annotated[tuple[UtilPct | None, ...], msgspec.Meta(min_length=1, max_length=1024)]


# == the agents' channel (per host, core NATS) ==================================================

MAX_HOST_TASKS = 1024
"""Parts one host can be told to run at once (one per GPU is the most that fits)."""

PartStop = Literal["notice", "cancel"]


class HostTask(_Wire, frozen=True, kw_only=True):
    """One part the host must run, as the log says now. ``stop``: the part must stop
    (``notice``: SIGKILL at ``kill_at``, the grace deadline; ``cancel``: the agent's own
    ``--kill-after-s`` from when it first sees it). ``started``: the log already holds this
    attempt's ``WorkloadStarted`` (a part the agent does not have was lost in a restart)."""

    workload_id: Name
    allocation: Name | None = None
    attempt: Attempt
    gpus: Annotated[tuple[GpuIndex, ...], msgspec.Meta(min_length=1, max_length=1024)]
    """This host's GPU indices (``CUDA_VISIBLE_DEVICES``)."""
    primary: bool
    """The part that reports (the first host of the assignment, sorted); the others of a
    gang only run and stop."""
    command: Command = ()
    env: Env = {}
    """The submission's ``env``."""
    duration_s: Annotated[float, msgspec.Meta(gt=0.0, le=MAX_TIME)] | None = None
    started: bool = False
    stop: PartStop | None = None
    kill_at: Timestamp | None = None
    hosts: Annotated[tuple[Name, ...], msgspec.Meta(max_length=1024)] = ()
    """The attempt's hosts, primary first, then the others in assignment order: the part
    gets them as ``ALLOT_HOSTS``, its index as ``ALLOT_HOST_RANK`` (empty: not sent, as by
    a dispatch service older than this field)."""
    checkpoint: bool = False
    """Issue 40: the part follows the checkpoint protocol (the fields below, a session)."""
    checkpoint_signal: CheckpointSignal | None = None
    checkpoint_timeout_s: CheckpointTimeout | None = None
    checkpoint_dir: CheckpointDir | None = None
    session: bool = False
    user: Name | None = None
    """The submission's user, sent with the command (an agent started with
    ``--run-as-user`` runs the part as that OS account; None: not sent, as for a started
    part or by a dispatch service older than this field)."""


class HostWork(_Message, frozen=True, kw_only=True):
    """``allot.v1.host.<host>.work``: everything the host must run now. Level-triggered: a
    part the agent runs that is not listed has ended in the log and stops. ``seq`` is the
    WORKLOADS stream position the view reflects; an agent ignores an older one."""

    host: Name
    seq: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    at: Timestamp
    tasks: Annotated[tuple[HostTask, ...], msgspec.Meta(max_length=MAX_HOST_TASKS)] = ()


class HostSync(_Message, frozen=True, kw_only=True):
    """``allot.v1.host.<host>.sync`` (request): answered with that host's ``HostWork``."""

    host: Name


PartEvent = Literal["started", "exited", "lost", "not-started"]


class PartReport(_Message, frozen=True, kw_only=True):
    """``allot.v1.host.<host>.report`` (request), from the primary part's agent, answered
    ``CommandAccepted`` once the log holds what it caused, or ``CommandRejected``.

    The agent says what happened to the process; the dispatch service, which checks that
    ``host`` is the attempt's primary host, chooses the log record from the log's view
    (cancel requested -> cancelled, under notice -> preempted, exit 0 -> completed, else
    failed). ``lost``: the part ran under an earlier agent process; ``not-started``: it
    could not be started (``detail`` says why) or was stopped before it started."""

    host: Name
    workload_id: Name
    attempt: Attempt
    event: PartEvent
    at: Timestamp
    started_at: Timestamp | None = None
    """When this agent reported the start (the charge runs from it)."""
    pid: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    exit_code: Annotated[int, msgspec.Meta(ge=-255, le=255)] | None = None
    detail: Text = ""
    stopping: bool = False
    """The agent is shutting down (a non-zero exit is its doing, not the workload's)."""
    checkpoint: CheckpointOutcome | None = None
    """Issue 40: how the part answered its notice (an end after a notice, protocol on)."""
    checkpointed_at: Timestamp | None = None
    """The last checkpoint the part confirmed in this attempt (None: none)."""
    checkpoint_dir: CheckpointDir | None = None
    """A start's: where the attempt's checkpoints go (``ALLOT_CHECKPOINT_DIR``)."""


MAX_REPORTS = 200
"""Reports in one ``PartReports`` (about 250 bytes each without ``detail``; the sender also
keeps the body under the 64 KiB payload limit)."""


class PartReports(_Message, frozen=True, kw_only=True):
    """``allot.v1.hosts.report`` (request): many hosts' reports in one message, from an agent
    that speaks for every host (a fake agent simulating a cluster; NATS grants the subject
    to service users only). Each item is judged exactly as if it came alone on its own
    host's ``report`` subject, and answered in order (``PartReportsAnswered``)."""

    reports: Annotated[tuple[PartReport, ...], msgspec.Meta(min_length=1, max_length=MAX_REPORTS)]


class WatchLog(_Message, frozen=True, kw_only=True):
    """``allot.v1.watch.<allocation>`` (request): read one workload's records of the log.
    The service answering it creates a JetStream consumer over that allocation's workload
    (``records``: its lifecycle ``events`` or its preemption ``notices``) from stream
    sequence ``start_seq`` (0: from the beginning) and delivers them, with idle heartbeats,
    on ``allot.v1.watched.<allocation>.<deliver>``; subscribe there before asking. Answered
    ``WatchStarted`` or ``CommandRejected``. Teams never create consumers themselves."""

    workload_id: Name
    records: Literal["events", "notices"]
    deliver: Name
    """A token of the watcher's choosing (random): the last token of the delivery subject."""
    start_seq: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0
    """The stream sequence to start at (a JetStream sequence is below 2**63 in practice)."""


# == workload events ===========================================================================


class HostGpus(_Wire, frozen=True, kw_only=True):
    """One host's part of an assignment."""

    host: Name
    gpus: Annotated[tuple[GpuIndex, ...], msgspec.Meta(min_length=1, max_length=1024)]


Assignment = Annotated[tuple[HostGpus, ...], msgspec.Meta(min_length=1, max_length=4096)]


class WorkloadAccepted(_Message, frozen=True, kw_only=True):
    """``duplicate``: the ``client_id`` was seen before; this repeats the first answer.
    ``allocated``: the work is protected for its ``min_runtime_s`` and charged to its
    allocation, which takes both an allocation and a minimum runtime; ``note`` says why not
    when only one of the two was given (the work runs unallocated: free, preemptible at any
    moment)."""

    workload_id: Name
    client_id: Name
    allocation: Name | None = None
    at: Timestamp
    duplicate: bool = False
    allocated: bool = False
    note: Text = ""


class WorkloadRejected(_Message, frozen=True, kw_only=True):
    """``field`` names what was wrong (``gpus``, ``allocation``, ``body``...)."""

    client_id: Name | None = None
    allocation: Name | None = None
    at: Timestamp
    field: Text
    reason: Text


class SubmitBatchAnswered(_Message, frozen=True, kw_only=True):
    """Intake's answer to a ``SubmitBatch``: one result per item, in the items' order. A
    batch that does not decode at all is answered with one ``WorkloadRejected`` instead."""

    at: Timestamp
    results: tuple[WorkloadAccepted | WorkloadRejected, ...]


class WorkloadSubmitted(_Message, frozen=True, kw_only=True):
    """Intake's log record of an accepted submission: everything placement and agents need
    to run it. ``workload_id`` is derived from (allocation, client_id), so a resubmission
    is the same workload and the fold ignores a second record of it."""

    workload_id: Name
    client_id: Name
    user: Name
    gpus: Gpus
    allocation: Name | None = None
    min_runtime_s: MinRuntime = 0
    resumable: bool = True
    kind: Name = "training"
    priority: Priority = 0
    command: Command = ()
    env: Env = {}
    duration_s: Annotated[float, msgspec.Meta(gt=0.0, le=MAX_TIME)] | None = None
    checkpoint_signal: CheckpointSignal | None = None
    """Issue 40: the signal the agent sends at a notice, before SIGTERM."""
    checkpoint_timeout_s: CheckpointTimeout | None = None
    """How long the checkpoint may take (at most the grace period; None: until the deadline)."""
    checkpoint_dir: CheckpointDir | None = None
    """Where checkpoints go (shared storage; None: a directory the agents manage)."""
    at: Timestamp


class CancelRequested(_Message, frozen=True, kw_only=True):
    """Intake's log record of an accepted cancel: placement drops pending work, the agent
    stops running work and reports ``WorkloadCancelled``."""

    workload_id: Name
    allocation: Name | None = None
    by: Name
    reason: Text = ""
    at: Timestamp


class LeaderElected(_Message, frozen=True, kw_only=True):
    """A placement instance won the lease. Every later decision carries this ``epoch``;
    folds ignore decisions of an older epoch (fencing)."""

    epoch: Epoch
    leader: Name
    at: Timestamp


class WorkloadQueued(_Message, frozen=True, kw_only=True):
    """``position`` is 1-based in the pending queue (1 = served first); ``sort_metric`` is
    tier + (1 - fairshare factor), smaller served first, and ``rank`` the allocation's Fair
    Tree rank (the highest is served first within a tier)."""

    workload_id: Name
    allocation: Name | None = None
    at: Timestamp
    position: Annotated[int, msgspec.Meta(ge=1)]
    sort_metric: Annotated[float, msgspec.Meta(ge=-1e18, le=1e18)]
    rank: Annotated[int, msgspec.Meta(ge=1)] | None = None
    why: Text = ""
    reason: Text = ""
    """The pending-reason code (``docs/reasons.md``), as in ``QueueRow.reason``."""
    est_start: Timestamp | None = None
    """An ESTIMATE of the start, as in ``QueueRow.est_start``."""


class WorkloadPlaced(_Message, frozen=True, kw_only=True):
    workload_id: Name
    allocation: Name | None = None
    at: Timestamp
    gpus: Gpus
    assignment: Assignment
    min_runtime_s: MinRuntime = 0
    attempt: Attempt = 1
    epoch: Epoch = 0


class WorkloadStarted(_Message, frozen=True, kw_only=True):
    workload_id: Name
    allocation: Name | None = None
    at: Timestamp
    host: Name
    pid: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    attempt: Attempt = 1
    gpus: GpuCount = 0
    allocated: bool = False
    """Charged to ``allocation`` (allocated work); accounting charges nothing otherwise."""
    checkpoint_dir: CheckpointDir | None = None
    """Issue 40: where this attempt's checkpoints go (``ALLOT_CHECKPOINT_DIR``), as its
    agent reported it; None for work without the checkpoint protocol."""


class PreemptionNotice(_Message, frozen=True, kw_only=True):
    """The workload must leave by ``grace_deadline``; its GPUs are free then. The numbers
    behind the decision travel with it (the core's ``Preemption``)."""

    workload_id: Name
    allocation: Name | None = None
    at: Timestamp
    reason: PreemptReason
    grace_deadline: Timestamp
    requeue: bool
    gpus: Gpus
    preemptor: Name | None = None
    victim_held_gpus: GpuCount = 0
    victim_entitlement_gpus: NonNegative = 0.0
    attempt: Attempt = 1
    epoch: Epoch = 0
    victim_window_gpu_s: NonNegative | None = None
    """GPU-seconds the victim's allocation was charged over the usage window (Fair Tree's
    input), as last ranked; None for unallocated work or before a ranking."""
    victim_rank: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Slurm's Fair Tree rank (the highest is served first), as ``RankRow.rank``."""
    preemptor_allocation: Name | None = None
    preemptor_window_gpu_s: NonNegative | None = None
    preemptor_rank: Annotated[int, msgspec.Meta(ge=1)] | None = None
    victim_fairshare: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    """The victim allocation's fairshare factor as last ranked (1 = served first within a
    tier); what the dashboard shows rather than the rank."""
    preemptor_fairshare: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None


class WorkloadPreempted(_Message, frozen=True, kw_only=True):
    workload_id: Name
    allocation: Name | None = None
    at: Timestamp
    reason: PreemptReason
    gpu_seconds: NonNegative = 0.0
    attempt: Attempt = 1
    gpus: GpuCount = 0
    started_at: RunStart | None = None
    allocated: bool = False
    checkpoint: CheckpointOutcome | None = None
    """Issue 40: how the attempt answered its notice (None: no checkpoint protocol, or no
    notice: a host's drain or loss)."""
    checkpointed_at: Timestamp | None = None
    """The attempt's last confirmed checkpoint, as its agent reported it."""
    lost_gpu_seconds: NonNegative = 0.0
    """GPU-seconds of the attempt lost to the preemption: gpus x (at - checkpointed_at, or
    started_at without one) (docs/decisions/0053)."""


class WorkloadRequeued(_Message, frozen=True, kw_only=True):
    workload_id: Name
    allocation: Name | None = None
    at: Timestamp
    attempt: Annotated[int, msgspec.Meta(ge=1)] = 1
    epoch: Epoch = 0


class WorkloadCompleted(_Message, frozen=True, kw_only=True):
    workload_id: Name
    allocation: Name | None = None
    at: Timestamp
    gpu_seconds: NonNegative = 0.0
    attempt: Attempt = 1
    gpus: GpuCount = 0
    started_at: RunStart | None = None
    allocated: bool = False


class WorkloadFailed(_Message, frozen=True, kw_only=True):
    workload_id: Name
    allocation: Name | None = None
    at: Timestamp
    exit_code: Annotated[int, msgspec.Meta(ge=-255, le=255)] | None = None
    reason: Text = ""
    gpu_seconds: NonNegative = 0.0
    attempt: Attempt = 1
    gpus: GpuCount = 0
    started_at: RunStart | None = None
    allocated: bool = False


class WorkloadCancelled(_Message, frozen=True, kw_only=True):
    workload_id: Name
    allocation: Name | None = None
    at: Timestamp
    by: Name | None = None
    reason: Text = ""
    gpu_seconds: NonNegative = 0.0
    attempt: Attempt = 1
    gpus: GpuCount = 0
    started_at: RunStart | None = None
    allocated: bool = False


# == host events ===============================================================================


class HostRegistered(_Message, frozen=True, kw_only=True):
    """The health service saw a host for the first time (or its GPU count changed)."""

    host: Name
    gpus: Gpus
    at: Timestamp


class HostDraining(_Message, frozen=True, kw_only=True):
    """Nothing new lands; running work leaves as its protection ends. ``by`` is the
    operator for a manual drain, absent when health checks started it."""

    host: Name
    at: Timestamp
    reason: Text = ""
    by: Name | None = None


class HostDrained(_Message, frozen=True, kw_only=True):
    host: Name
    at: Timestamp
    epoch: Epoch = 0


class HostHealthy(_Message, frozen=True, kw_only=True):
    host: Name
    at: Timestamp


# == GPU utilization and idle allocated work (USAGE stream, written by the health service) =====


class PartUtilization(_Wire, frozen=True, kw_only=True):
    """One allocated run's GPUs on the host, as the health service judged a report:
    ``util_pct`` the highest of their utilizations (null: one was not read), ``idle_since``
    since when every sample of them was below the idle threshold (null: not idle) and
    ``peak_pct`` the highest utilization since then (``allot.core.idle``)."""

    workload_id: Name
    allocation: Name
    attempt: Attempt
    gpus: Annotated[tuple[GpuIndex, ...], msgspec.Meta(min_length=1, max_length=1024)]
    util_pct: UtilPct | None = None
    idle_since: Timestamp | None = None
    peak_pct: UtilPct = 0.0


class HostUtilizationRecorded(_Message, frozen=True, kw_only=True):
    """``allot.v1.usage.gpu.<host>``: one ``HostUtilization`` of a host running allocated
    work, checked and attributed to the runs holding its GPUs, with each run's idle evidence
    after it. The last one per host re-seeds the detection after a restart."""

    host: Name
    since: Timestamp
    until: Timestamp
    at: Timestamp
    parts: Annotated[tuple[PartUtilization, ...], msgspec.Meta(max_length=1024)] = ()


IdleClearWhy = Literal["busy", "ended", "no-samples"]
"""Why an idle flag ends: a sample at or above the threshold, the run's end, or no sample
for longer than the allowed gap (``allot.core.idle.ClearWhy``)."""


class WorkloadFlaggedIdle(_Message, frozen=True, kw_only=True):
    """``allot.v1.usage.idle.<allocation>.<workload>``: every GPU of the run stayed below
    ``threshold_pct`` from ``idle_since`` to ``at`` (at least ``window_s``). ``preempt``:
    the health service's policy asks for its preemption (``--idle-preempt``): the
    placement leader then notices it, reason ``idle``, once its protection has ended, and
    does not requeue it (docs/decisions/0055); otherwise flagged only."""

    workload_id: Name
    allocation: Name
    attempt: Attempt = 1
    user: Name | None = None
    gpus: Gpus
    at: Timestamp
    idle_since: Timestamp
    threshold_pct: UtilPct
    window_s: Seconds
    peak_pct: UtilPct = 0.0
    reason: Text = ""
    preempt: bool = False
    recorded_at: Timestamp | None = None
    """When health wrote the flag (``at`` is the time of the report that raised it, up to
    minutes earlier): what readers tell a copy stored again by (decision 0085); None in
    flags written before it was recorded."""


class WorkloadIdleCleared(_Message, frozen=True, kw_only=True):
    """The end of a flagged idle stretch ``[idle_since, until]``: ``idle_gpu_seconds`` =
    ``gpus x (until - idle_since)``, GPU time charged while idle."""

    workload_id: Name
    allocation: Name
    attempt: Attempt = 1
    gpus: Gpus
    at: Timestamp
    idle_since: Timestamp
    until: Timestamp
    why: IdleClearWhy
    idle_gpu_seconds: NonNegative = 0.0


# == budgets ===================================================================================


class BudgetNodeSpec(_Wire, frozen=True, kw_only=True):
    """One node of a budget tree (the nested format of ``budgets.yaml``); ``shares`` null
    is Slurm's ``parent``."""

    name: Name
    shares: Annotated[int, msgspec.Meta(ge=0, le=MAX_SHARES)] | None = 1
    children: Annotated[tuple[BudgetNodeSpec, ...], msgspec.Meta(max_length=10_000)] = ()


class BudgetTreeSet(_Message, frozen=True, kw_only=True):
    """The whole budget tree after a change; the last one on its subject is current."""

    at: Timestamp
    by: Name
    tree: BudgetNodeSpec


# == command replies ===========================================================================


class CommandAccepted(_Message, frozen=True, kw_only=True):
    at: Timestamp
    detail: Text = ""


class CommandRejected(_Message, frozen=True, kw_only=True):
    """``field`` names what was wrong, ``reason`` why."""

    at: Timestamp
    field: Text
    reason: Text


class WatchStarted(_Message, frozen=True, kw_only=True):
    """A watch's consumer exists: records arrive on ``subject`` (as JetStream deliveries
    from ``consumer``, with a ``Status: 100`` idle heartbeat every ``heartbeat_s``). The
    consumer is removed once nobody has listened on ``subject`` for ``inactive_s``."""

    at: Timestamp
    consumer: Name
    subject: Text
    heartbeat_s: Seconds
    inactive_s: Seconds


class PartReportsAnswered(_Message, frozen=True, kw_only=True):
    """Dispatch's answer to ``PartReports``: one answer per report, in the reports' order,
    each what the report alone would have been answered. A batch that does not decode at
    all is answered with one ``CommandRejected`` instead."""

    at: Timestamp
    answers: tuple[CommandAccepted | CommandRejected, ...]


# == ranking ===================================================================================

LevelFs = Annotated[float, msgspec.Meta(ge=0.0, le=1e18)] | Literal["inf"] | None


class RankRow(_Wire, frozen=True, kw_only=True):
    """One node of the Fair Tree ranking (``allot.core.fairshare.NodeRank``)."""

    path: Annotated[str, msgspec.Meta(max_length=(MAX_NAME_LEN + 1) * (MAX_BUDGET_DEPTH + 1))]
    name: Name
    leaf: bool
    raw_shares: Annotated[int, msgspec.Meta(ge=0, le=MAX_SHARES)] | None
    norm_shares: NonNegative
    raw_usage: NonNegative
    effective_usage: NonNegative
    level_fs: LevelFs
    rank: Annotated[int, msgspec.Meta(ge=1)] | None = None
    fairshare: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None


class RankingUpdated(_Message, frozen=True, kw_only=True):
    at: Timestamp
    window_s: Seconds
    nodes: Annotated[tuple[RankRow, ...], msgspec.Meta(max_length=100_000)]


# == queries (request/reply, answered by the placement leader or the ranking service) ==========


class StatusQuery(_Message, frozen=True, kw_only=True):
    workload_id: Name


LIVE_STATES: frozenset[str] = frozenset({"running", "noticed"})
"""The ``WorkloadStatus.state`` values of a workload holding its GPUs (placed, maybe under
notice)."""


class WorkloadStatus(_Message, frozen=True, kw_only=True):
    """``state``: pending, running, noticed (under preemption notice), completed, failed,
    cancelled, preempted (ended by preemption, not resumable), unknown.

    ``started_at`` (its placement, Slurm's job start) and ``assignment`` are the current
    attempt's while it runs and, once the workload has ended, its last attempt's (as
    ``sacct`` shows); ``run_started_at`` is when that attempt's host reported its process
    started, None until it has (placed, not yet running there); ``ended_at``, ``exit_code``
    (0 for completed), ``reason`` (a failure's or a cancel's reason, a preemption's code)
    and ``cancelled_by`` are set only once it has ended, as far as its end record says.
    ``requeued_at`` and ``requeue_reason`` (a preemption's code), only while it is pending
    again: when and why its last attempt (``attempt``) ended and sent it back to the queue
    (Slurm's ``Restarts`` and requeue reason). ``command`` is the submission's (as
    ``scontrol show job``'s ``Command``); ``env_names`` the names of its ``env``, not their
    values (a value may be a token)."""

    workload_id: Name
    state: Literal[
        "pending", "running", "noticed", "completed", "failed", "cancelled", "preempted", "unknown"
    ]
    allocation: Name | None = None
    user: Name | None = None
    gpus: GpuCount = 0
    attempt: GpuCount = 0
    submitted_at: Timestamp | None = None
    started_at: PlacedAt | None = None
    run_started_at: RunStart | None = None
    protected_until: Timestamp | None = None
    preempt_at: Timestamp | None = None
    assignment: tuple[HostGpus, ...] = ()
    position: GpuCount | None = None
    ended_at: Timestamp | None = None
    exit_code: Annotated[int, msgspec.Meta(ge=-255, le=255)] | None = None
    reason: Text = ""
    cancelled_by: Name | None = None
    requeued_at: Timestamp | None = None
    requeue_reason: Text = ""
    command: Command = ()
    env_names: Annotated[tuple[EnvName, ...], msgspec.Meta(max_length=MAX_ENV)] = ()
    checkpoints: Annotated[tuple[AttemptCheckpoint, ...], msgspec.Meta(max_length=1024)] = ()
    """Issue 40: each preempted attempt's checkpoint outcome, oldest first (the last 1,024)."""
    checkpoint_dir: CheckpointDir | None = None
    """Where the last started attempt's checkpoints (a session's state) go."""
    kind: Name = "training"


class QueueRow(_Wire, frozen=True, kw_only=True):
    """One pending workload, in service order (``position`` 1 = served first). ``tier``:
    under-entitlement, over-entitlement or unallocated; ``fairshare``: the allocation's
    fairshare factor, 1 = served first within a tier; ``rank``: Slurm's Fair Tree rank
    (the highest first); ``sort_metric`` = tier index + (1 - fairshare), smaller first."""

    position: Annotated[int, msgspec.Meta(ge=1)]
    workload_id: Name
    allocation: Name | None = None
    user: Name
    gpus: Gpus
    kind: Name
    tier: Literal["under-entitlement", "over-entitlement", "unallocated"]
    rank: Annotated[int, msgspec.Meta(ge=1)] | None = None
    fairshare: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    sort_metric: Annotated[float, msgspec.Meta(ge=0.0, le=1e6)]
    priority: Priority = 0
    submitted_at: Timestamp
    why: Text = ""
    reason: Text = ""
    """A pending-reason code (``allot.core.reasons.PendingReason``; docs/reasons.md)."""
    reason_numbers: Annotated[
        dict[Annotated[str, msgspec.Meta(max_length=MAX_NAME_LEN)], float | int | Text],
        msgspec.Meta(max_length=16),
    ] = msgspec.field(default_factory=dict)
    """The numbers behind ``reason`` (entitlement, held GPUs, deadlines...)."""
    est_start: Timestamp | None = None
    """An ESTIMATE of the start: the notice deadline or protection end the reason names,
    or the next moment anything can change; None when nothing bounds it (running work
    declares no time limit)."""


class QueueSnapshot(_Message, frozen=True, kw_only=True):
    """The first ``len(rows)`` pending workloads in service order (at most
    ``MAX_QUEUE_ROWS``: a NATS message holds 1 MiB); ``total`` counts all of them."""

    at: Timestamp
    epoch: Epoch = 0
    free_gpus: GpuCount = 0
    rows: Annotated[tuple[QueueRow, ...], msgspec.Meta(max_length=1_000_000)] = ()
    total: Annotated[int, msgspec.Meta(ge=0)] = 0


class PrioRow(_Wire, frozen=True, kw_only=True):
    """``allot prio`` (like ``sprio -l``): one pending workload's position broken into its
    inputs; ``tier`` 0 under entitlement, 1 at or over it, 2 unallocated."""

    position: Annotated[int, msgspec.Meta(ge=1)]
    workload_id: Name
    allocation: Name | None = None
    user: Name
    gpus: Gpus
    tier: Annotated[int, msgspec.Meta(ge=0, le=2)]
    tier_name: Text
    held: GpuCount = 0
    entitlement: NonNegative = 0.0
    order_key: Annotated[int, msgspec.Meta(ge=0)] | None = None
    rank: Annotated[int, msgspec.Meta(ge=1)] | None = None
    fairshare: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    priority: Priority = 0
    age_s: Seconds = 0.0


class PrioSnapshot(_Message, frozen=True, kw_only=True):
    at: Timestamp
    rows: Annotated[tuple[PrioRow, ...], msgspec.Meta(max_length=1_000_000)] = ()
    total: Annotated[int, msgspec.Meta(ge=0)] = 0


class HostRow(_Wire, frozen=True, kw_only=True):
    """One host as the placement leader's fold of the log sees it. A draining or drained
    host carries the drain that put it there (like ``sinfo -R``): ``drain_reason``,
    ``drain_by`` (the operator; None when the health service drained it) and ``drain_at``.

    There is no heartbeat time: heartbeats go to the health service on core NATS and never
    reach the log, so placement cannot know one (``last_heartbeat``, never set, was removed).
    """

    host: Name
    state: Literal["healthy", "draining", "drained", "cordoned"]
    gpus: Gpus
    free_gpus: GpuCount
    workloads: Annotated[tuple[Name, ...], msgspec.Meta(max_length=1024)] = ()
    drain_reason: Text = ""
    drain_by: Name | None = None
    drain_at: Timestamp | None = None
    short_lane: bool = False
    """The host is in placement's short lane (``--short-lane``): only unallocated work and
    short allocated work start there."""


class HostsQuery(_Message, frozen=True, kw_only=True):
    """``allot hosts``, one page: the hosts whose ids sort after ``after`` (none: from the
    first). An empty request body, or ``{}``, asks for the first page."""

    after: Name | None = None


class HostsSnapshot(_Message, frozen=True, kw_only=True):
    """One page of hosts in id order, as many as one NATS message holds, and ``total``,
    the hosts registered in all: ask again with ``after`` = the last row's host for the
    next page (``AllotClient.hosts`` reads every page)."""

    at: Timestamp
    hosts: Annotated[tuple[HostRow, ...], msgspec.Meta(max_length=1_000_000)] = ()
    total: Annotated[int, msgspec.Meta(ge=0)] = 0


class AllocationRow(_Wire, frozen=True, kw_only=True):
    """One allocation now: budget (effective share), entitlement and GPUs held."""

    allocation: Name
    effective_share: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
    entitlement_gpus: NonNegative
    held_gpus: GpuCount = 0
    pending_workloads: Annotated[int, msgspec.Meta(ge=0)] = 0
    pending_gpus: Annotated[int, msgspec.Meta(ge=0)] = 0


class AllocationsSnapshot(_Message, frozen=True, kw_only=True):
    """``allot.v1.query.allocations`` (placement leader): held vs entitlement per leaf."""

    at: Timestamp
    healthy_gpus: GpuCount = 0
    total_gpus: GpuCount = 0
    rows: Annotated[tuple[AllocationRow, ...], msgspec.Meta(max_length=100_000)] = ()


class PlacementStats(_Message, frozen=True, kw_only=True):
    """``allot.v1.query.placement_stats``: the leader's scheduling-cycle duration histogram
    (Prometheus style: ``buckets_s`` upper bounds, ``counts`` cumulative, +Inf last).

    ``decide_s`` and ``append_wait_s`` are two parts of the cycles' summed duration
    ``sum_s``: deciding (a snapshot of the fold and the core's ``run_cycle`` over it) and
    waiting for the log to acknowledge the cycle's appends (its fsynced writes); the rest
    is building the records and publishing queue positions. A leader whose cycles are
    mostly ``append_wait_s`` is limited by the log's write path, not by the policy."""

    at: Timestamp
    epoch: Epoch = 0
    cycles: Annotated[int, msgspec.Meta(ge=0)] = 0
    decisions: Annotated[int, msgspec.Meta(ge=0)] = 0
    buckets_s: Annotated[tuple[NonNegative, ...], msgspec.Meta(max_length=64)] = ()
    counts: Annotated[
        tuple[Annotated[int, msgspec.Meta(ge=0)], ...], msgspec.Meta(max_length=65)
    ] = ()
    sum_s: NonNegative = 0.0
    count: Annotated[int, msgspec.Meta(ge=0)] = 0
    decide_s: NonNegative = 0.0
    append_wait_s: NonNegative = 0.0


class OwedQuery(_Message, frozen=True, kw_only=True):
    """``allot owed``: owed vs delivered GPU-hours over the last ``window_s``."""

    window_s: Annotated[float, msgspec.Meta(gt=0.0, le=90 * 86400.0)] = 7 * 86400.0
    bucket_s: Annotated[int, msgspec.Meta(ge=60, le=86400)] = 3600


class OwedRow(_Wire, frozen=True, kw_only=True):
    allocation: Name
    owed_gpu_h: NonNegative
    delivered_gpu_h: NonNegative
    ratio: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    effective_share: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    idle_gpu_h: NonNegative = 0.0
    """GPU-hours its allocated work held in flagged idle stretches within the window
    (``WorkloadFlaggedIdle``; a stretch still open counts up to the answer's ``at``)."""
    lost_gpu_h: NonNegative = 0.0
    """Issue 40: GPU-hours of its work lost to preemptions that ended within the window:
    since each attempt's last confirmed checkpoint (docs/decisions/0053)."""


class OwedSnapshot(_Message, frozen=True, kw_only=True):
    """Owed vs delivered, computed from the log exactly as the simulator's report computes
    it (``allot.sim.report``), over ``[since, at]``."""

    at: Timestamp
    since: Timestamp
    window_s: Seconds
    bucket_s: Annotated[int, msgspec.Meta(ge=1)]
    overall: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    rows: Annotated[tuple[OwedRow, ...], msgspec.Meta(max_length=100_000)] = ()


USAGE_KEPT_S = 8 * 86400
"""How far back the usage store keeps charges (the fair-share window and a day)."""


class UsageQuery(_Message, frozen=True, kw_only=True):
    """``allot.v1.query.usage``: the GPU-seconds charged to each allocation in the window of
    ``window_s`` ending now (default: the fair-share window, 7 days)."""

    window_s: Annotated[int, msgspec.Meta(ge=1, le=USAGE_KEPT_S)] = 7 * 86400


class UsageRow(_Wire, frozen=True, kw_only=True):
    allocation: Name
    gpu_seconds: NonNegative


class UsageSnapshot(_Message, frozen=True, kw_only=True):
    """What accounting has charged, per allocation with any charge, in ``[at - window_s,
    at]`` (the hour straddling the start pro rata, as the ranking counts it). A finished run
    is charged in full once its end is read; running work is charged by whole slots, up to
    ``charged_until`` (None before the first accrual): the rest of it is not counted yet."""

    at: Timestamp
    window_s: Annotated[int, msgspec.Meta(ge=1)]
    charged_until: Timestamp | None = None
    rows: Annotated[tuple[UsageRow, ...], msgspec.Meta(max_length=100_000)] = ()


class IdleRow(_Wire, frozen=True, kw_only=True):
    """One run flagged idle now (``WorkloadFlaggedIdle`` not cleared)."""

    workload_id: Name
    allocation: Name
    attempt: Attempt = 1
    user: Name | None = None
    gpus: Gpus
    idle_since: Timestamp
    flagged_at: Timestamp
    peak_pct: UtilPct = 0.0
    reason: Text = ""


class IdleSnapshot(_Message, frozen=True, kw_only=True):
    """``allot.v1.query.idle`` (every allocation; operators, managers) or
    ``allot.v1.query.idle.<allocation>`` (a team's own), answered by the health service:
    the runs flagged idle now, oldest stretch first (the first that fit in one NATS
    message), ``total`` of them, and the policy that flagged them."""

    at: Timestamp
    threshold_pct: UtilPct
    window_s: Seconds
    rows: Annotated[tuple[IdleRow, ...], msgspec.Meta(max_length=100_000)] = ()
    total: Annotated[int, msgspec.Meta(ge=0)] = 0


# == the log's history (allot.v1.query.history, answered by the ranking service) ===============

HISTORY_STREAMS = ("WORKLOADS", "HOSTS", "USAGE")
"""What ``HistoryQuery`` may read: USAGE is read on its budget trees, or (``idle``) on its
idle records."""
HISTORY_PAGE_MAX = 1000
"""The most records one ``HistoryPage`` holds (the service may hold fewer: its byte bound)."""
HistorySeq = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]


class HistoryQuery(_Message, frozen=True, kw_only=True, omit_defaults=True):
    """``allot.v1.query.history`` (``allot export``, ``allot whatif``, ``allot budgets
    history`` under logins): one page of a log stream, from ``start_seq`` or from the first
    record stored at or after ``start_time`` (neither: from the stream's first record; not
    both). The answering service reads at most ``limit`` records and a bounded number of
    bytes; a submission's record comes without its ``command`` and ``env``. USAGE is read on
    its budget trees, or instead with ``idle`` on its idle records (health's flags), with
    ``rankings`` on the ranking service's snapshots (``allot twin``); not both. Fields left
    at their defaults are not sent: a ranking service older than a field still answers the
    queries that do not use it."""

    stream: Literal["WORKLOADS", "HOSTS", "USAGE"]
    start_seq: HistorySeq | None = None
    start_time: Timestamp | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=HISTORY_PAGE_MAX)] = 500
    idle: bool = False
    rankings: bool = False


class HistoryRecord(_Wire, frozen=True, kw_only=True):
    """One record of the log: its stream sequence, subject, and the record as the log holds
    it (JSON; decode it by its subject), a submission's without ``command`` and ``env``."""

    seq: HistorySeq
    subject: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    record: msgspec.Raw


class HistoryPage(_Message, frozen=True, kw_only=True):
    """One page of ``stream``: ``records`` in sequence order; ask again from ``next_seq``
    until ``end`` (the stream's end when read; ``last_seq`` was its last sequence then).
    ``omitted``: records of the page the service could not decode, or copies of earlier
    records stored again (docs/decisions/0085), left out."""

    stream: Literal["WORKLOADS", "HOSTS", "USAGE"]
    records: Annotated[tuple[HistoryRecord, ...], msgspec.Meta(max_length=HISTORY_PAGE_MAX)]
    next_seq: HistorySeq
    last_seq: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    end: bool
    omitted: Annotated[int, msgspec.Meta(ge=0)] = 0
    at: Timestamp


# == end of the log's history ================================================================


# == groups ====================================================================================

WorkloadEvent = (
    WorkloadSubmitted
    | CancelRequested
    | WorkloadPlaced
    | WorkloadStarted
    | WorkloadPreempted
    | WorkloadRequeued
    | WorkloadCompleted
    | WorkloadFailed
    | WorkloadCancelled
)
HostEvent = HostRegistered | HostDraining | HostDrained | HostHealthy
IdleEvent = WorkloadFlaggedIdle | WorkloadIdleCleared

EVENT_NAME: dict[type[msgspec.Struct], str] = {
    WorkloadSubmitted: "submitted",
    CancelRequested: "cancel_requested",
    WorkloadPlaced: "placed",
    WorkloadStarted: "started",
    WorkloadPreempted: "preempted",
    WorkloadRequeued: "requeued",
    WorkloadCompleted: "completed",
    WorkloadFailed: "failed",
    WorkloadCancelled: "cancelled",
}
"""The lifecycle events the log holds, and the last token of each one's subject
(``allot.v1.events.<allocation>.<workload>.<event>``; ``allot.proto.subjects.EVENT_NAMES``).
``WorkloadAccepted``, ``WorkloadRejected`` (answers) and ``WorkloadQueued`` (core NATS) are
never logged."""

COMMANDS: tuple[type[msgspec.Struct], ...] = (
    SubmitWorkload,
    SubmitBatch,
    CancelWorkload,
    SetBudget,
    DrainHost,
    UndrainHost,
    Heartbeat,
    HealthReport,
    HostUtilization,
    PartReport,
    PartReports,
    HostSync,
    WatchLog,
)
EVENTS: tuple[type[msgspec.Struct], ...] = (
    WorkloadSubmitted,
    CancelRequested,
    LeaderElected,
    WorkloadAccepted,
    WorkloadRejected,
    WorkloadQueued,
    WorkloadPlaced,
    WorkloadStarted,
    PreemptionNotice,
    WorkloadPreempted,
    WorkloadRequeued,
    WorkloadCompleted,
    WorkloadFailed,
    WorkloadCancelled,
    HostRegistered,
    HostDraining,
    HostDrained,
    HostHealthy,
    RankingUpdated,
    BudgetTreeSet,
    HostWork,
    HostUtilizationRecorded,
    WorkloadFlaggedIdle,
    WorkloadIdleCleared,
)
REPLIES: tuple[type[msgspec.Struct], ...] = (
    SubmitBatchAnswered,
    PartReportsAnswered,
    CommandAccepted,
    CommandRejected,
    StatusQuery,
    WorkloadStatus,
    QueueSnapshot,
    PrioSnapshot,
    HostsQuery,
    HostsSnapshot,
    AllocationsSnapshot,
    PlacementStats,
    OwedQuery,
    OwedSnapshot,
    UsageQuery,
    UsageSnapshot,
    IdleSnapshot,
    WatchStarted,
    HistoryQuery,
    HistoryPage,
)
MESSAGES = COMMANDS + EVENTS + REPLIES
