"""Throwaway database servers and network-namespace test hosts for the reliability tests.

``mariadb_server`` and ``postgres_server`` start a server of their own (own data directory
under /tmp, own port, own socket) that a test may stop, kill and start again in the middle of
its work without disturbing the shared servers the rest of the suite uses.

``netns_hosts`` makes three test hosts: network namespaces joined to the host by veth pairs on
a private bridge (``10.231.<n>.0/24``, on those links only). A throwaway server listens on the
bridge address, so work done in a namespace reaches the database over the namespace link, and
cutting a host's link cuts it off for real (no reset is sent; its connections just go silent).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.settings import SUFFIX  # one per pytest process (several under -n): see there

ROOT = Path(__file__).resolve().parents[2]
# One number per suffix, so that two suffixes' runs never share ports, subnets or names.
_N = int(hashlib.sha1(SUFFIX.encode()).hexdigest(), 16) % 200 + 20
BASE = Path(tempfile.gettempdir()) / f"taskloop_reliab_{SUFFIX}"
#: The fixtures that start servers or change the network; tests that use them run only when
#: asked (TASKLOOP_START_SERVERS=1, as .ci/run does), see tests/conftest.py.
SERVER_FIXTURES = {"bridge", "netns_hosts", "mariadb_server", "postgres_server", "throwaway", "galera"}
SUBNET = f"10.231.{_N}"
BRIDGE_ADDRESS = f"{SUBNET}.1"
DB_NAME = "taskloop_reliab"
HOSTS = 3


def _free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


class _Exited(Exception):
    """The server process ended while we waited for it."""


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except _Exited:
            raise
        except Exception:  # the server is still coming up
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout} s")
        time.sleep(0.1)


@dataclass
class Server:
    """A database server owned by the test session: start, stop, kill, start again."""

    vendor: str
    port: int
    directory: Path
    listen: list[str]
    process: subprocess.Popen | None = None
    running: bool = False
    #: More ``mariadbd`` options (a Galera node's ``--wsrep-…``), after the ones every server gets.
    options: list[str] = field(default_factory=list)
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.directory / "server.log"

    def url(self, host: str = "127.0.0.1", name: str = DB_NAME) -> str:
        """Return the ``DATABASE_URL`` of database ``name`` reached through ``host``."""
        if self.vendor == "mysql":
            return f"mysql://root@{host}:{self.port}/{name}"
        return f"postgres://postgres@{host}:{self.port}/{name}"

    # -- life cycle ---------------------------------------------------------------------------

    def install(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
        if self.vendor == "mysql":
            subprocess.run(
                [
                    "mariadb-install-db",
                    "--no-defaults",
                    f"--datadir={self.directory / 'data'}",
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ],
                check=True,
                capture_output=True,
            )
        else:
            shutil.chown(self.directory, "postgres", "postgres")
            self._as_postgres(
                [
                    "/usr/lib/postgresql/15/bin/initdb",
                    "-D",
                    str(self.directory / "data"),
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                ]
            )
            with open(self.directory / "data" / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {SUBNET}.0/24 trust\n")

    def start(self) -> None:
        """Start the server and wait until it accepts connections.

        A MariaDB that exits while coming up (after a kill it may still find its files held
        for a moment) is started again, up to three times; a server that never answers
        fails with the end of its log."""
        if self.vendor == "mysql":
            for attempt in range(3):
                self._start_mariadb()
                try:
                    _wait(self._ready, 60, f"mysql on port {self.port}")
                except _Exited:
                    self.process = None
                    time.sleep(1 + attempt)
                    continue
                except TimeoutError as error:
                    if self.process is not None:
                        self.process.kill()
                        self.process.wait(timeout=60)
                        self.process = None
                    raise TimeoutError(f"{error}; its log ends:\n{self._log_tail()}") from None
                self.running = True
                return
            raise RuntimeError(
                f"mysql on port {self.port} exited three times; its log ends:\n{self._log_tail()}"
            )
        self._start_postgres()
        try:
            _wait(self.ping, 60, f"{self.vendor} on port {self.port}")
        except TimeoutError as error:
            raise TimeoutError(f"{error}; its log ends:\n{self._log_tail()}") from None
        self.running = True

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise _Exited(self.process.returncode)
        return self.ping()

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as error:
            return f"(no log: {error})"

    def _start_mariadb(self) -> None:
        data = self.directory / "data"
        self.process = subprocess.Popen(
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={data}",
                f"--port={self.port}",
                f"--bind-address={','.join(self.listen)}",
                f"--socket={self.directory / 'mysqld.sock'}",
                f"--pid-file={self.directory / 'mysqld.pid'}",
                "--user=root",
                # A throwaway server on private addresses: no passwords to manage.
                "--skip-grant-tables",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                "--innodb-flush-log-at-trx-commit=2",
                "--innodb-lock-wait-timeout=10",
                # A client cut off in the middle of a transaction keeps its row locks until
                # the server drops it; production servers need this too (docs/guarantees.md).
                "--idle-transaction-timeout=10",
                "--max-connections=400",
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_unicode_ci",
                f"--log-error={self.log}",
                *self.options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _start_postgres(self) -> None:
        self._as_postgres(
            [
                "/usr/lib/postgresql/15/bin/pg_ctl",
                "-D",
                str(self.directory / "data"),
                "-l",
                str(self.log),
                "-w",
                "-o",
                f"-p {self.port} -k {self.directory} -c listen_addresses='{','.join(self.listen)}' "
                # fsync=off is safe here: a crash of the server (not of the machine) loses nothing
                # written to the OS; synchronous_commit stays on, as restart tests need.
                "-c fsync=off -c full_page_writes=off -c max_connections=300 "
                # A client cut off in the middle of a transaction keeps its row locks until
                # the server drops it; production servers need this too (docs/guarantees.md).
                "-c idle_in_transaction_session_timeout=10s",
                "start",
            ],
            check=False,
        )

    def stop(self, *, crash: bool = False) -> None:
        """Stop the server: cleanly, or (``crash``) at once, as a power cut would."""
        self.running = False
        if self.vendor == "mysql":
            if self.process is not None:
                self.process.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
                self.process.wait(timeout=60)
                self.process = None
        else:
            mode = "immediate" if crash else "fast"
            self._as_postgres(
                [
                    "/usr/lib/postgresql/15/bin/pg_ctl",
                    "-D",
                    str(self.directory / "data"),
                    "-m",
                    mode,
                    "-w",
                    "stop",
                ],
                check=False,
            )
        _wait(lambda: _free(self.port), 30, f"{self.vendor} port {self.port} to close")

    def pids(self) -> list[int]:
        """The server's processes: MariaDB's one; PostgreSQL's postmaster and its children."""
        if self.vendor == "mysql":
            return [self.process.pid] if self.process is not None else []
        postmaster = int((self.directory / "data" / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout
        return [postmaster, *(int(pid) for pid in children.split())]

    def freeze(self) -> None:
        """Hang the server (SIGSTOP to each of its processes): its connections stay open and
        the kernel still accepts what is sent, but nothing answers, as with a server that
        swaps or a network that drops packets without a reset."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):  # (a backend that just ended)
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen server go on (SIGCONT)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def ping(self) -> bool:
        self.execute("SELECT 1", database=None)
        return True

    def reachable(self) -> bool:
        """Say whether the server answers right now."""
        try:
            return self.ping()
        except self.driver_errors():
            return False

    def driver_errors(self) -> tuple[type[BaseException], ...]:
        """The driver's error classes (a refused connection, a killed session, …)."""
        if self.vendor == "mysql":
            import MySQLdb

            return (MySQLdb.Error,)
        import psycopg

        return (psycopg.Error,)

    # -- plain SQL, without Django: the test process keeps Django on the suite's database ----

    def connect(self, database: str | None = DB_NAME, host: str = "127.0.0.1") -> Any:
        if self.vendor == "mysql":
            import MySQLdb

            kwargs: dict[str, Any] = {"host": host, "port": self.port, "user": "root", "connect_timeout": 5}
            if database:
                kwargs["database"] = database
            connection = MySQLdb.connect(**kwargs)
            connection.autocommit(True)
            return connection
        import psycopg

        return psycopg.connect(
            host=host,
            port=self.port,
            user="postgres",
            dbname=database or "postgres",
            autocommit=True,
            connect_timeout=5,
        )

    def execute(
        self, sql: str, params: Sequence[Any] = (), database: str | None = DB_NAME
    ) -> list[tuple[Any, ...]]:
        connection = self.connect(database)
        try:
            cursor = connection.cursor()
            cursor.execute(sql, params or None)
            rows = list(cursor.fetchall()) if cursor.description else []
            cursor.close()
            return rows
        finally:
            connection.close()

    def recreate_database(self) -> None:
        """Drop and create :data:`DB_NAME`, then make the tables of the test models in it."""
        if self.vendor == "mysql":
            self.execute(f"DROP DATABASE IF EXISTS {DB_NAME}", database=None)
            self.execute(f"CREATE DATABASE {DB_NAME} CHARACTER SET utf8mb4", database=None)
        else:
            self.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)", database=None)
            self.execute(f"CREATE DATABASE {DB_NAME}", database=None)
        run_remote(self.url(), "tests.reliability.remote:create_schema")

    def _as_postgres(self, argv: list[str], check: bool = True) -> None:
        # PostgreSQL refuses to run as root.
        subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=check, capture_output=True)


def django_env(database_url: str, **extra: str) -> dict[str, str]:
    """Return the environment of a Django subprocess working on ``database_url``."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url,
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "testproject")]),
        PYTHONUNBUFFERED="1",
    )
    env.pop("TASKLOOP_EXPECT_VENDOR", None)
    env.update(extra)
    return env


def run_remote(
    database_url: str, target: str, *args: Any, netns: str | None = None, timeout: float = 300
) -> Any:
    """Run ``module:function(*args)`` in a fresh Django process on ``database_url``; return its result.

    The function's return value travels back as JSON (the last line of its output).
    """
    argv = [sys.executable, "-m", "tests.reliability.remote", target, json.dumps(list(args))]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    done = subprocess.run(
        argv, env=django_env(database_url), cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode:
        raise AssertionError(f"{target} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _make_server(vendor: str, listen: list[str]) -> Iterator[Server]:
    port = (33000 if vendor == "mysql" else 54000) + _N
    if not _free(port):
        pytest.fail(f"port {port} for the throwaway {vendor} server is taken (a stale run? see {BASE})")
    server = Server(vendor, port, BASE / vendor, listen)
    server.install()
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        shutil.rmtree(server.directory, ignore_errors=True)


# -- network namespaces --------------------------------------------------------------------------


@dataclass
class Host:
    """A test host: a network namespace linked to the test machine by a veth pair."""

    name: str
    netns: str
    address: str
    host_side: str

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside this host."""
        return subprocess.Popen(["ip", "netns", "exec", self.netns, *argv], **kwargs)

    def cut(self) -> None:
        """Cut the link: packets stop both ways, no connection is told."""
        _ip("link", "set", self.host_side, "down")

    def restore(self) -> None:
        _ip("link", "set", self.host_side, "up")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def namespaces_available() -> str | None:
    """Return why network namespaces cannot be made here, or ``None`` if they can."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"tlprobe{_N}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"ip netns add failed: {made.stderr.strip()} (needs root / CAP_SYS_ADMIN)"
    _ip("netns", "del", probe, check=False)
    return None


def _teardown_netns(count: int) -> None:
    for i in range(1, count + 1):
        _ip("netns", "del", f"tl{_N}h{i}", check=False)
        _ip("link", "del", f"tl{_N}v{i}", check=False)
    _ip("link", "del", f"tl{_N}br", check=False)


@pytest.fixture(scope="session")
def bridge() -> Iterator[str | None]:
    """The private bridge the test hosts hang on: its address, or ``None`` without namespaces."""
    reason = namespaces_available()
    if reason:
        yield None
        shutil.rmtree(BASE, ignore_errors=True)
        return
    _teardown_netns(HOSTS)  # leftovers of a killed run
    name = f"tl{_N}br"
    _ip("link", "add", name, "type", "bridge")
    _ip("addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", name)
    _ip("link", "set", name, "up")
    try:
        yield BRIDGE_ADDRESS
    finally:
        _teardown_netns(HOSTS)
        shutil.rmtree(BASE, ignore_errors=True)


@pytest.fixture(scope="session")
def netns_hosts(bridge: str | None) -> Iterator[list[Host]]:
    """Three test hosts on the private bridge, whose address is :data:`BRIDGE_ADDRESS`."""
    if bridge is None:
        pytest.skip(f"network namespaces cannot be created here: {namespaces_available()}")
    hosts = []
    try:
        for i in range(1, HOSTS + 1):
            netns, outside, inside = f"tl{_N}h{i}", f"tl{_N}v{i}", f"tl{_N}p{i}"
            _ip("netns", "add", netns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", outside, "master", f"tl{_N}br")
            _ip("link", "set", outside, "up")
            _ip("link", "set", inside, "netns", netns)
            address = f"{SUBNET}.{10 + i}"
            _ip("-n", netns, "addr", "add", f"{address}/24", "dev", inside)
            _ip("-n", netns, "link", "set", inside, "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            hosts.append(Host(f"host{i}", netns, address, outside))
        yield hosts
    finally:
        for host in hosts:
            _ip("netns", "del", host.netns, check=False)
            _ip("link", "del", host.host_side, check=False)


# -- servers -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mariadb_server(bridge: str | None) -> Iterator[Server]:
    """A MariaDB server of this session's own (listening on 127.0.0.1 and the bridge)."""
    yield from _make_server("mysql", ["127.0.0.1", bridge] if bridge else ["127.0.0.1"])


@pytest.fixture(scope="session")
def postgres_server(bridge: str | None) -> Iterator[Server]:
    """A PostgreSQL server of this session's own (listening on 127.0.0.1 and the bridge)."""
    yield from _make_server("postgresql", ["127.0.0.1", bridge] if bridge else ["127.0.0.1"])


@pytest.fixture(scope="session")
def suite_vendor() -> str:
    """The vendor this run is for (``DATABASE_URL``), without opening a connection."""
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    return {"sqlite3": "sqlite", "mysql": "mysql", "postgresql": "postgresql"}[engine.rsplit(".", 1)[-1]]


@pytest.fixture
def throwaway(request: Any, suite_vendor: str) -> Server:
    """The throwaway server of this run's vendor (PostgreSQL on SQLite runs), with a fresh database.

    SQLite is embedded: there is no server to restart or to reach over a link, so SQLite runs
    exercise the networked scenarios on PostgreSQL (and MariaDB gets them on its own runs).
    """
    name = "mariadb_server" if suite_vendor == "mysql" else "postgres_server"
    server: Server = request.getfixturevalue(name)
    if not server.running:
        server.start()
    server.recreate_database()
    return server
