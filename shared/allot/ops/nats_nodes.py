"""The replicated log of ``allot up --nats-cluster N``: N clustered nats-servers, not one.

``allot.ops.stack`` runs ``allot.adapters.nats_cluster.EmbeddedNatsCluster`` on loopback,
each node's store under ``<run_dir>/nats-cluster/n<i>/store`` (its config and log beside
it), and gives every service all N URLs (``ALLOT_NATS_URL``, comma-separated) and
``ALLOT_STREAM_REPLICAS=N``: every stream and KV bucket has a copy on each node, so the log
survives losing any minority of them (one of three, two of five).

* N is 1 (one server, no cluster: the default), 3 or 5. An even count tolerates no more
  lost nodes than the odd one below it (a majority of 4 is 3) and JetStream keeps at most
  5 replicas of a stream.
* The streams are created at N replicas before the services start
  (``allot.ops.log_streams``):
  six services creating replicated streams at once on a fresh cluster outlasted nats-py's
  5 s API timeout (seen in ``bench/chaos_cluster.py``), and a service that dies while the
  stack starts stops the start.
* A node that exits is restarted on its ports and store by the stack's supervision, within
  the same restart budget as a service (``Stack.supervise``); it catches up from the others.
* Not with ``--secure`` (yet): every node would need the generated users and TLS, the
  routes their own credentials, and each user's URL all N servers.
"""

from __future__ import annotations

from pathlib import Path

from allot.core.errors import ValidationError

OPTION = "--nats-cluster"
NODE_COUNTS = (1, 3, 5)
CLUSTER_DIR = "nats-cluster"
"""Where the nodes' stores, configs and logs go, under the run directory."""
SINGLE_STORE_DIR = "jetstream"
"""The one embedded server's store, under the run directory (``allot.ops.stack``)."""


def node_name(i: int) -> str:
    """The stack's name of node ``i`` (0-based): ``nats-1``... (its processes, its restarts)."""
    return f"nats-{i + 1}"


def check_nodes(nodes: int, *, nats_url: str | None, secure: bool, run_dir: Path) -> None:
    """Refuse a node count the stack cannot run, naming ``--nats-cluster``."""
    if nodes not in NODE_COUNTS:
        raise ValidationError(
            OPTION,
            f"must be 1, 3 or 5, got {nodes}: an odd number of nodes, each holding every "
            "stream (an even count tolerates no more lost nodes than the odd one below it; "
            "JetStream keeps at most 5 replicas)",
        )
    if nodes == 1:
        return
    if nats_url is not None:
        raise ValidationError(
            OPTION,
            "runs its own NATS nodes: do not give --nats-url (for a cluster of your own, "
            "give --nats-url every server, comma-separated, with ALLOT_STREAM_REPLICAS set)",
        )
    if secure:
        raise ValidationError(
            OPTION, "does not run with --secure yet: run one or the other (deploy/README.md)"
        )
    found = sorted((run_dir / CLUSTER_DIR).glob("n[0-9]*"))
    if found and len(found) != nodes:
        raise ValidationError(
            OPTION,
            f"{run_dir / CLUSTER_DIR} holds the stores of a {len(found)}-node cluster: run "
            f"with {OPTION} {len(found)}, or remove that folder to start a new, empty log",
        )


def other_store_note(run_dir: Path, nodes: int) -> str | None:
    """A line for the banner when ``run_dir`` holds a log of the other layout, which this
    stack does not read (a cluster's stores are not one server's, nor the reverse)."""
    if nodes > 1 and any((run_dir / SINGLE_STORE_DIR).glob("*")):
        return (
            f"note: the one-server log in {run_dir / SINGLE_STORE_DIR} is not used by a "
            "cluster (this one starts from its own stores)"
        )
    if nodes == 1 and any((run_dir / CLUSTER_DIR).glob("n[0-9]*")):
        return (
            f"note: the cluster's log in {run_dir / CLUSTER_DIR} is not used by one server "
            f"(run with {OPTION} to use it)"
        )
    return None
