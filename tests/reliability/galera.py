"""A throwaway three-node Galera cluster on loopback ports, and a TCP proxy in front of it.

The nodes are :class:`~.conftest.Server` MariaDB servers with the wsrep provider loaded. Node 1
bootstraps the cluster; nodes 2 and 3 start from a copy of its data directory taken after a
clean stop (so they join with its state and need no state transfer: rsync SST does not work on
every machine). :class:`Proxy` forwards one port to whichever node is the writer now, as
MaxScale or ProxySQL do in a single-writer deployment.
"""

from __future__ import annotations

import contextlib
import select
import shutil
import socket
import threading
import time
import warnings
from pathlib import Path

from .conftest import BASE, Server, _wait

PROVIDER = Path("/usr/lib/galera/libgalera_smm.so")
NODES = 3


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def status(node: Server, name: str) -> str:
    """A ``SHOW GLOBAL STATUS`` value of ``node`` ("" if missing)."""
    rows = node.execute("SHOW GLOBAL STATUS LIKE %s", [name], database=None)
    return str(rows[0][1]) if rows else ""


class Cluster:
    """Three MariaDB nodes replicating each other with Galera (every one writable)."""

    def __init__(self, directory: Path = BASE / "galera") -> None:
        self.directory = directory
        self._configure()

    def _configure(self) -> None:
        """Three nodes on ports nobody uses now (a fresh set for each try of :meth:`start`)."""
        directory = self.directory
        gcomm = [free_port() for _ in range(NODES)]
        address = "gcomm://" + ",".join(f"127.0.0.1:{port}" for port in gcomm)
        self.nodes = [
            Server("mysql", free_port(), directory / f"node{i + 1}", ["127.0.0.1"]) for i in range(NODES)
        ]
        for i, node in enumerate(self.nodes):
            node.options = [
                "--wsrep-on=ON",
                f"--wsrep-provider={PROVIDER}",
                "--wsrep-cluster-name=taskloop",
                f"--wsrep-cluster-address={address}",
                f"--wsrep-node-name=node{i + 1}",
                f"--wsrep-node-address=127.0.0.1:{gcomm[i]}",
                # Short failure detection: a killed node leaves the view within seconds.
                "--wsrep-provider-options="
                f"gmcast.listen_addr=tcp://127.0.0.1:{gcomm[i]};ist.recv_addr=127.0.0.1:{free_port()};"
                "gcache.size=64M;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT6S;"
                "evs.inactive_check_period=PT1S;evs.keepalive_period=PT1S;evs.install_timeout=PT5S",
                "--binlog-format=ROW",
                "--innodb-autoinc-lock-mode=2",
                "--default-storage-engine=InnoDB",
                "--wsrep-slave-threads=2",
                # A joiner's state transfer is IST (it starts from node 1's state); the donor
                # still hands it over with rsync, to a port of this cluster's own.
                f"--wsrep-sst-receive-address=127.0.0.1:{free_port()}",
            ]

    def start(self, tries: int = 3) -> None:
        """Start the cluster; wait for all three nodes.

        A node that exits while coming up, three times in a row, is a cluster that did not
        start: once (CI, 2026-12-03) node 2's provider failed to open its group connection
        ("Failed to set thread schedparams other:0: System error: 3") on every one of its
        three starts, a failure of Galera's start on a loaded machine that no rerun of this
        machine reproduced (17 starts, quiet and at load 3). Such a cluster, or one whose
        nodes never synced, is made again from nothing, on fresh ports, up to ``tries`` times;
        each failed try is a warning in the test report, and the last one's error fails."""
        for attempt in range(1, tries + 1):
            try:
                self._start_once()
                return
            except (RuntimeError, TimeoutError) as error:  # a node exited thrice, or never synced
                self.stop()
                if attempt == tries:
                    raise
                warnings.warn(
                    f"galera: start {attempt} of {tries} failed, making the cluster again: {error}",
                    stacklevel=1,  # pyproject.toml shows this module's warnings, not as errors
                )
                self._configure()

    def _start_once(self) -> None:
        """Bootstrap node 1, give its state to nodes 2 and 3, start them; wait for all three."""
        first, *others = self.nodes
        first.install()
        bootstrap = [*first.options, "--wsrep-new-cluster"]
        first.options, options = bootstrap, first.options
        first.start()
        first.stop()  # clean: its grastate.dat now holds the cluster's id and position
        for node in others:
            shutil.rmtree(node.directory, ignore_errors=True)
            shutil.copytree(first.directory / "data", node.directory / "data")
            (node.directory / "data" / "galera.cache").unlink(missing_ok=True)
            # rsync's daemon on the joiner (run as root, it acts as nobody) writes there.
            (node.directory / "data").chmod(0o777)
        first.start()
        first.options = options  # a later start of node 1 joins the others
        for node in others:
            node.start()
        self.wait_synced(self.nodes)

    def wait_synced(self, nodes: list[Server], timeout: float = 90) -> None:
        """Wait until every one of ``nodes`` is ready and sees a cluster of ``len(nodes)``."""
        for node in nodes:
            _wait(
                lambda node=node: (
                    status(node, "wsrep_ready") == "ON"
                    and status(node, "wsrep_cluster_size") == str(len(nodes))
                    and status(node, "wsrep_local_state_comment") == "Synced"
                ),
                timeout,
                f"galera node {node.directory.name} synced in a cluster of {len(nodes)}",
            )

    def conflicts(self) -> int:
        """Certification failures and brute-force aborts the live nodes counted: each is a
        transaction that a client saw fail with error 1213 (deadlock), mostly at its commit."""
        total = 0
        for node in self.nodes:
            if node.running:
                total += int(status(node, "wsrep_local_cert_failures") or 0)
                total += int(status(node, "wsrep_local_bf_aborts") or 0)
        return total

    def stop(self) -> None:
        """Kill every node still running (never leave a mariadbd behind) and remove the files."""
        for node in self.nodes:
            if node.process is not None:
                with contextlib.suppress(Exception):
                    node.process.kill()
                    node.process.wait(timeout=60)
                node.process = None
                node.running = False
        shutil.rmtree(self.directory, ignore_errors=True)


class Proxy:
    """Forward ``127.0.0.1:port`` to a backend port that can be switched (MaxScale's role).

    New connections go to the current backend; :meth:`switch` also cuts the connections made
    to the old one, as a proxy does when it fails the writer over.
    """

    def __init__(self, backend: int) -> None:
        self.backend = backend
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.links: list[tuple[socket.socket, socket.socket, int]] = []
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name="galera-proxy").start()

    def switch(self, backend: int, cut: bool = True) -> None:
        """Send new connections to ``backend``; ``cut``: close those to any other (else they
        stay with the node they were made to)."""
        with self.lock:
            self.backend = backend
            stale = [link for link in self.links if link[2] != backend] if cut else []
        for client, server, _ in stale:
            _close(client, server)

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        with self.lock:
            links = list(self.links)
        for client, server, _ in links:
            _close(client, server)

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                backend = self.backend
            try:
                server = socket.create_connection(("127.0.0.1", backend), timeout=5)
            except OSError:
                client.close()  # the writer is down: the client sees a refused connection
                continue
            server.settimeout(None)
            link = (client, server, backend)
            with self.lock:
                self.links.append(link)
            threading.Thread(target=self._pump, args=(link,), daemon=True).start()

    def _pump(self, link: tuple[socket.socket, socket.socket, int]) -> None:
        client, server, _ = link
        pair = {client: server, server: client}
        try:
            while True:
                readable, _, _ = select.select(list(pair), [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    pair[sock].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            _close(client, server)
            with self.lock:
                if link in self.links:
                    self.links.remove(link)


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()


def reach_error() -> str | None:
    """(Run in a Django process on one node.) What the workers' look at a database says of it:
    the error that counts it unreachable (``engine.reach.unreachable``), or ``None``."""
    from django_taskloop.engine.reach import unreachable

    error = unreachable("default")
    return None if error is None else str(error.args[0] if error.args else error)


def not_ready_then_failover(flags: str) -> dict:
    """(Run in a Django process on the proxy, see test_galera.) Put a task, through the proxy,
    on the node it routes to; once that node is cut off (file ``flags/switched``), put one that
    fails with 1047, then one more: the proxy routes new connections to another node now, so
    it succeeds at once if the failed put dropped its connection."""
    from django.db import DatabaseError, connection

    from django_taskloop.models import Tube

    tube = Tube.objects.create_tube("g-ready", "fifo", if_not_exists=True)
    tube.put({"n": 0})
    Path(flags, "connected").touch()
    deadline = time.monotonic() + 60
    while not Path(flags, "switched").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    first_error = None
    try:
        tube.put({"n": 1})
    except DatabaseError as error:
        first_error = error.args[0] if error.args else str(error)
    dropped = connection.connection is None
    tube.put({"n": 2})
    return {"first_error": first_error, "dropped": dropped, "ready": tube.statistics()["tasks"]["ready"]}


def bump_shared_row(times: int, start_at: float) -> int:
    """(Run in a Django process on one node.) Add 1 to the one ``g-shared`` WorkLog row
    ``times`` times, each in a transaction of ``engine.run_in_transaction``, from ``start_at``
    (wall clock) on, so that the processes on the other nodes write it at the same moments;
    return how many transactions it committed."""
    from django.db.models import F

    from django_taskloop import engine
    from tests.testapp.models import WorkLog

    rows = WorkLog.objects.filter(kind="g-shared")
    time.sleep(max(0.0, start_at - time.time()))
    for _ in range(times):
        engine.run_in_transaction(WorkLog, "default", lambda: rows.update(at=F("at") + 1))
    return times
