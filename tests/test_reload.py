"""``manage.py workers --reload``: a code change starts the workers again, with Django's own
autoreloader, once the work in hand has finished (real processes on the test database).

The task is a Django Task in a module the test writes into a directory of its own on the
workers' ``PYTHONPATH``: version 1 returns "v1", the test rewrites it to return "v2".
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import pytest

from django_taskloop.management.commands.workers import Command, reload_wanted
from django_taskloop.models import TaskRecord
from tests.testapp.models import WorkLog

from .workers_util import alive, child_env, children_of, start_workers, wait_until

#: The Django Task of the test, @VERSION@ replaced by "v1", then "v2". It logs its start and end
#: in WorkLog (key: its name and version); given a path, it waits for that file before it ends.
SOURCE = """
import os
import time
from pathlib import Path

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

VERSION = "@VERSION@"


def log(name, phase):
    from tests.testapp.models import WorkLog

    key = f"{name}:{VERSION}"
    WorkLog.objects.create(kind="reload", key=key, phase=phase, pid=os.getpid(), at=time.time())


@task()
def version(name, release=""):
    log(name, "start")
    while release and not Path(release).exists():
        time.sleep(0.05)
    log(name, "end")
    return VERSION
"""


class Output:
    """What a process writes, as it comes: a thread drains its pipe line by line (so that the
    test can wait for a line; :func:`~tests.workers_util.stop` would read the same pipe)."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line)

    def __str__(self) -> str:
        return "".join(self.lines)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))


@pytest.fixture
def tasks(tmp_path: Path) -> Iterator[ModuleType]:
    """The task module, version 1, importable here (to enqueue) and by the workers."""
    name = f"reload_tasks_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(SOURCE.replace("@VERSION@", "v1"))
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def edit(module: ModuleType, output: Output, timeout: float = 60) -> Path:
    """Rewrite ``module`` as version 2 and wait until the workers say they reload; return its path.

    Django's StatReloader takes the mtime of a module the first time it sees it, within a
    second after its import: a write before that look would be the mtime it starts from. Each
    second without a reload moves the mtime on again (and past the second of any bytecode)."""
    path = Path(module.__file__ or "")
    path.write_text(SOURCE.replace("@VERSION@", "v2") + "# version 2\n")
    deadline = time.monotonic() + timeout
    for step in range(1, 1000):
        stamp = time.time() + 2 * step
        os.utime(path, (stamp, stamp))
        try:
            wait_until(lambda: output.count("changed: reloading the workers"), timeout=1.5)
            return path
        except AssertionError:
            if time.monotonic() > deadline:
                raise
    raise AssertionError("no reload")


def logged(key: str, phase: str) -> int:
    return WorkLog.objects.filter(kind="reload", key=key, phase=phase).count()


def succeeded(result: Any) -> bool:
    return TaskRecord.objects.filter(pk=result.id, status="SUCCESSFUL").exists()


def family(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    return [pid, *(p for child in children_of(pid) for p in family(child))]


@contextmanager
def reloading_workers(
    tmp_path: Path, *args: str, group: bool = False
) -> Iterator[tuple[subprocess.Popen[str], Output]]:
    """``manage.py workers --reload --only default *args``, the task module's directory on its
    path; killed with its processes if still running at the end (a failed test). ``group``: in
    a process group of its own, as a shell's job (the group the test then signals)."""
    worker = start_workers(
        "--reload",
        "--only",
        "default",
        *args,
        DJANGO_SETTINGS_MODULE="tests.workers_settings",
        TASKLOOP_OVERRIDES=json.dumps({"GRACE_PERIOD": 30, "HEARTBEAT_INTERVAL": 0.5}),
        PYTHONPATH=os.pathsep.join([str(tmp_path), child_env()["PYTHONPATH"]]),
        PYTHONDONTWRITEBYTECODE="1",
        preexec_fn=os.setpgrp if group else None,
    )
    assert worker.stdout is not None
    output = Output(worker.stdout)
    try:
        yield worker, output
    finally:
        if worker.poll() is None:
            for pid in family(worker.pid):
                os.kill(pid, signal.SIGKILL)
            worker.wait()
        output.reader.join(timeout=10)
        print(output)  # (shown if the test fails)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_code_change_reloads_the_workers_once_running_work_has_finished(
    tasks: ModuleType, tmp_path: Path, processes: str
) -> None:
    release = tmp_path / "release"
    with reloading_workers(tmp_path, "--processes", processes) as (worker, output):
        first = tasks.version.enqueue("first", str(release))
        wait_until(lambda: logged("first:v1", "start"), timeout=60)
        before = family(worker.pid)
        path = edit(tasks, output)
        # The reload waits for the task in hand, which waits for the test.
        time.sleep(1)
        assert logged("first:v1", "end") == 0, output
        assert output.count("watching for file changes with") == 1, output
        release.touch()
        wait_until(lambda: succeeded(first), timeout=60)
        # A new child, running the new code.
        wait_until(lambda: output.count("watching for file changes with") == 2, timeout=60)
        second = tasks.version.enqueue("second")
        wait_until(lambda: succeeded(second), timeout=60)
        after = family(worker.pid)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, output
    said = str(output)
    assert f"{path.resolve()} changed: reloading the workers after running work finishes" in said
    assert output.count("changed: reloading the workers") == 1, said
    # Both stops were the graceful one (one SIGTERM to each worker): nothing was cut off.
    assert output.count("SIGTERM, finishing work in hand") == 2 * int(processes), said
    assert "giving everything back now" not in said and "grace period over" not in said, said
    first.refresh()
    second.refresh()
    assert (first.return_value, second.return_value) == ("v1", "v2"), said
    # The task in hand when the file changed ran once, to its end, with the old code.
    assert list(WorkLog.objects.filter(kind="reload").order_by("at").values_list("key", "phase")) == [
        ("first:v1", "start"),
        ("first:v1", "end"),
        ("second:v2", "start"),
        ("second:v2", "end"),
    ], said
    # The reloader's parent, its child, and with --processes 2 the child's two workers: a new
    # child (and new workers) after the reload, and all of them gone at the end.
    assert len(before) == len(after) == {"1": 2, "2": 4}[processes], (before, after)
    assert before[0] == after[0] and not set(before[1:]) & set(after[1:]), (before, after)
    assert not any(alive(pid) for pid in before + after), said


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("first_comes", ["change", "stop"])
def test_a_stop_and_a_change_together_are_one_graceful_stop(
    tasks: ModuleType, tmp_path: Path, first_comes: str
) -> None:
    """A SIGTERM to the parent while the workers stop for a reload is not passed on (it would
    be their second: stop now), and a change after a stop does not stop them again; either
    way the running task finishes and nothing starts again."""
    release = tmp_path / "release"
    with reloading_workers(tmp_path) as (worker, output):
        first = tasks.version.enqueue("first", str(release))
        wait_until(lambda: logged("first:v1", "start"), timeout=60)
        if first_comes == "change":
            edit(tasks, output)
            worker.send_signal(signal.SIGTERM)
        else:
            time.sleep(1.5)  # the reloader (once a second) has seen the module: it sees a change
            worker.send_signal(signal.SIGTERM)
            wait_until(lambda: output.count("SIGTERM, finishing work in hand"))
            path = Path(tasks.__file__ or "")
            path.write_text(SOURCE.replace("@VERSION@", "v2"))
            stamp = time.time() + 2
            os.utime(path, (stamp, stamp))
        # Time for a second signal, or a reload, to show.
        time.sleep(2.5)
        assert logged("first:v1", "end") == 0, output
        release.touch()
        assert worker.wait(timeout=60) == 0, output
    said = str(output)
    assert output.count("changed: reloading the workers") == (first_comes == "change"), said
    assert output.count("SIGTERM, finishing work in hand") == 1, said
    assert "giving everything back now" not in said and "grace period over" not in said, said
    assert output.count("watching for file changes with") == 1, said
    first.refresh()
    assert first.return_value == "v1", said
    assert logged("first:v1", "start") == logged("first:v1", "end") == 1, said


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_sent_to_the_whole_process_group_is_one_graceful_stop(
    tasks: ModuleType, tmp_path: Path, signum: int
) -> None:
    """A terminal's Ctrl-C reaches every process of the foreground job, ``timeout`` signals its
    whole process group: the reloader's parent and its child both get the signal. The child
    must not take the parent's passing it on as a second one (stop now): found trying the
    README's development setup, where one Ctrl-C cut the running handler off."""
    release = tmp_path / "release"
    with reloading_workers(tmp_path, group=True) as (worker, output):
        first = tasks.version.enqueue("first", str(release))
        wait_until(lambda: logged("first:v1", "start"), timeout=60)
        os.killpg(worker.pid, signum)
        time.sleep(2.5)  # time for a second signal to show
        assert logged("first:v1", "end") == 0, output
        release.touch()
        assert worker.wait(timeout=60) == 0, output
    said = str(output)
    assert "giving everything back now" not in said and "grace period over" not in said, said
    assert output.count("finishing work in hand") == 1, said
    first.refresh()
    assert first.return_value == "v1", said
    assert logged("first:v1", "start") == logged("first:v1", "end") == 1, said


def test_reload_is_on_under_debug_unless_asked_otherwise(settings: Any) -> None:
    parser = Command().create_parser("manage.py", "workers")
    assert parser.parse_args([]).reload is None
    assert parser.parse_args(["--reload"]).reload is True
    assert parser.parse_args(["--noreload"]).reload is False
    settings.DEBUG = False
    assert reload_wanted(None, burst=False) is False
    assert reload_wanted(True, burst=False) is True
    settings.DEBUG = True
    assert reload_wanted(None, burst=False) is True
    assert reload_wanted(False, burst=False) is False
    # A burst drains and exits: nothing to reload, unless asked.
    assert reload_wanted(None, burst=True) is False
    assert reload_wanted(True, burst=True) is True


@pytest.mark.slow
def test_the_reloaders_parent_exits_with_its_childs_status() -> None:
    """A child that fails (here: no such handler) is not started again: its status is the
    command's."""
    done = subprocess.run(
        [sys.executable, "-m", "django", "workers", "--reload", "--only", "nope"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("watching for file changes with") == 1, done.stderr
    assert done.stderr.count("unknown handler") == 1, done.stderr
