"""Drive ``manage.py workers`` subprocesses for the reliability tests, and break them."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from tests.workers_util import ROOT, child_env, children_of, workers_command

# Short beats and grace: a killed worker's leases (3 s, see workerapp) are renewed every second
# while it lives.
OVERRIDES = '{"HEARTBEAT_INTERVAL": 1, "GRACE_PERIOD": 5, "RETRY_BACKOFF": 0.2}'
SETTINGS = "tests.reliability.worker_settings"


@dataclass
class Workers:
    """A ``manage.py workers`` supervisor running in the background, its output in a file."""

    process: subprocess.Popen[bytes]
    log: Any
    killed: list[int] = field(default_factory=list)

    @classmethod
    def start(
        cls, *args: str, env: dict[str, str] | None = None, prefix: list[str] | None = None, **extra: str
    ) -> Workers:
        connections.close_all()  # nothing of ours leaks into the children
        log = tempfile.NamedTemporaryFile(prefix="taskloop-reliab-", suffix=".log")
        environment = env or child_env(DJANGO_SETTINGS_MODULE=SETTINGS, TASKLOOP_OVERRIDES=OVERRIDES, **extra)
        # A worker that hangs can be made to show where: SIGABRT dumps every thread's stack.
        environment["PYTHONFAULTHANDLER"] = "1"
        process = subprocess.Popen(
            [*(prefix or []), *workers_command(*args)],
            env=environment,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return cls(process, log)

    def children(self) -> list[int]:
        return children_of(self.process.pid)

    def kill_one(self) -> int | None:
        """``kill -9`` one random live worker process; return its pid."""
        alive = [pid for pid in self.children() if pid not in self.killed]
        if not alive:
            return None
        victim = random.choice(alive)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            return None
        self.killed.append(victim)
        return victim

    def dump_stacks(self) -> str:
        """Make every worker process print its threads' stacks and die; return the output."""
        for pid in self.children():
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        time.sleep(1)
        return self.output()

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 60) -> str:
        """SIGTERM the supervisor, wait for it, return everything the workers wrote."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.output()


def wait_until(predicate: Callable[[], Any], timeout: float, every: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(every)


def executions(kind: str) -> Counter[str]:
    """How many times each key was run, from the handlers' ``WorkLog``."""
    from tests.testapp.models import WorkLog

    return Counter(WorkLog.objects.filter(kind=kind).values_list("key", flat=True))
