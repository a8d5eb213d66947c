"""``manage.py workers`` at start and through an outage, as a subprocess: a database without
django-taskloop's tables is one line and exit status 2; a database that is down (at start, or
for a while mid-run) is one line per backoff step naming the alias and host, then one line when
it is back, and the work goes on."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection, connections

from django_taskloop.models import Tube
from tests.testapp.models import WorkLog

from .workers_util import ROOT, child_env, stop, wait_until, workers_command

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _empty_database(vendor: str, tmp_path: Path) -> Iterator[str]:
    """Yield the URL of a database that exists and holds no table."""
    if vendor == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.sqlite3'}"
        return
    name = f"{connection.settings_dict['TEST']['NAME']}_empty"
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {qn(name)}")
        cursor.execute(f"CREATE DATABASE {qn(name)}")
    try:
        url = child_env()["DATABASE_URL"]
        yield url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        connections.close_all()
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {qn(name)}")


@pytest.mark.parametrize("processes", ["1", "2"])  # 2: the supervisor looks before it forks
def test_an_unmigrated_database_is_one_line_and_status_2(vendor, tmp_path, processes):
    for url in _empty_database(vendor, tmp_path):
        run = subprocess.run(
            workers_command("--burst", "--processes", processes),
            env=child_env(DATABASE_URL=url),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 2, run.stderr
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, run.stderr
        assert "database 'default'" in lines[0] and "run manage.py migrate" in lines[0], lines


class Proxy:
    """A TCP proxy in front of the test database server that the test can take down (its port
    closed, every connection through it cut) and bring back on the same port."""

    def __init__(self, upstream: tuple[int, object]) -> None:
        self.family, self.address = upstream
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.listener: socket.socket | None = None
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self.lock:
            listener, self.listener = self.listener, None
            sockets, self.open = self.open, []
        if listener is not None:
            # shutdown() wakes the accept() blocked on it (close() alone would not, on Linux,
            # and the port would stay open).
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.socket(self.family)  # type: ignore[call-overload]
            try:
                server.connect(self.address)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def proxy(vendor) -> Iterator[Proxy]:
    assert vendor != "sqlite", "SQLite has no server to lose: mark the test vendors(...)"
    settings = connection.settings_dict
    if settings.get("HOST") and not settings["HOST"].startswith("/"):
        upstream: tuple[int, object] = (
            socket.AF_INET,
            (settings["HOST"], int(settings.get("PORT") or 0) or 3306),
        )
    else:  # PostgreSQL over its socket (postgres:///test): the server sees a local client
        upstream = (
            socket.AF_UNIX,
            f"{settings.get('HOST') or '/var/run/postgresql'}/.s.PGSQL.{settings.get('PORT') or 5432}",
        )
    made = Proxy(upstream)
    yield made
    made.down()


def _through(proxy: Proxy) -> str:
    """The test database's URL, through ``proxy``."""
    settings = connection.settings_dict
    scheme = {"mysql": "mysql", "postgresql": "postgres"}[connection.vendor]
    user = settings.get("USER") or "root"
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    return f"{scheme}://{user}{password}@127.0.0.1:{proxy.port}/{settings['NAME']}"


class Output:
    """The lines a worker writes, read as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        self.thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))


def _start(url: str, *args: str) -> tuple[subprocess.Popen[str], Output]:
    connections.close_all()
    process = subprocess.Popen(
        workers_command("--only", "w-drain", *args),
        env=child_env(DATABASE_URL=url),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process, Output(process)


def _assert_said_in_one_line_per_step(output: Output, proxy: Proxy) -> None:
    steps = [line for line in output.lines if "unreachable" in line]
    assert steps, output.lines
    assert all(f"database 'default' (127.0.0.1:{proxy.port})" in line for line in steps), steps
    assert output.count("is back") == 1, output.lines
    assert output.count("Traceback") == 0, output.lines


@pytest.mark.vendors("mysql", "postgresql")  # SQLite has no server to lose
def test_a_database_down_at_start_is_waited_for_one_line_per_step(proxy):
    tube = Tube.objects.create_tube("w-drain", "fifottl", if_not_exists=True)
    ids = {str(tube.put({"n": n}).id) for n in range(3)}
    process, output = _start(_through(proxy), "--burst")
    wait_until(lambda: output.count("unreachable") >= 2, timeout=60)
    proxy.up()
    process.wait(timeout=120)
    output.thread.join(timeout=10)
    assert process.returncode == 0, output.lines
    assert set(WorkLog.objects.filter(kind="drain").values_list("key", flat=True)) == ids
    _assert_said_in_one_line_per_step(output, proxy)
    # Before: ~140 lines of tracebacks. Now: the start line, a line per step, the back line,
    # the batch and the summary.
    assert len(output.lines) < 20, output.lines


@pytest.mark.vendors("mysql", "postgresql")  # SQLite has no server to lose
def test_an_outage_mid_run_is_one_line_per_step_and_work_goes_on(proxy):
    tube = Tube.objects.create_tube("w-drain", "fifottl", if_not_exists=True)
    proxy.up()
    process, output = _start(_through(proxy))
    try:
        first = tube.put({"n": 1}).id
        wait_until(lambda: WorkLog.objects.filter(kind="drain", key=str(first)).exists(), timeout=60)
        proxy.down()
        wait_until(lambda: output.count("unreachable") >= 3, timeout=60)
        later = tube.put({"n": 2}).id  # put past the proxy, while the worker cannot see it
        time.sleep(1)
        proxy.up()
        wait_until(lambda: WorkLog.objects.filter(kind="drain", key=str(later)).exists(), timeout=60)
    finally:
        stop(process)
        output.thread.join(timeout=10)
        print("\n".join(output.lines))
    _assert_said_in_one_line_per_step(output, proxy)
    # Before: about 1,000 lines for a 12 s outage. Now: a line per backoff step (a few), the
    # back line, the two batches, the stop and the summary.
    assert len(output.lines) < 30, output.lines
