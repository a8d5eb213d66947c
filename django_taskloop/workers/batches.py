"""What a worker keeps about its batches: how each batch ran, what each handler did, when the
heartbeat's chores are due, and how an item is named in logs and the progress store."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..engine.deadline import bounded
from ..models.operating import record_throughput
from . import FailedForGood
from .drivers import AnyDriver

__all__ = ["Batch", "Chores", "Tally", "ThroughputCounts", "count", "outcome", "progress_key"]


@dataclass
class Tally:
    """What one handler did in one process, for the summary at exit."""

    batches: int = 0
    done: int = 0
    failed: int = 0
    given_back: int = 0
    seconds: float = 0.0


class ThroughputCounts:
    """What the batches settled since the last write of the throughput rows (the dashboard's
    per-minute counts), per driver; the heartbeat writes them."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.pending: dict[AnyDriver, list[int]] = {}

    def add(self, driver: AnyDriver, done: int, failed: int, given_back: int) -> None:
        with self.lock:
            counts = self.pending.setdefault(driver, [0, 0, 0])
            counts[0] += done
            counts[1] += failed
            counts[2] += given_back

    def flush(self, waits: Callable[[AnyDriver], bool], failed: Callable[[AnyDriver], None]) -> None:
        """Write the counts (one row update per queue). Those of a driver that ``waits`` (its
        shard is parked) stay for a later flush, as do those whose write fails (``failed``
        is called, in the ``except`` block, to say so)."""
        with self.lock:
            pending, self.pending = self.pending, {}
        for driver, (done, failed_items, given_back) in pending.items():
            if not waits(driver):
                try:
                    with bounded(driver.using):
                        record_throughput(
                            driver.queue_kind,
                            driver.queue,
                            done=done,
                            failed=failed_items,
                            given_back=given_back,
                            using=driver.using,
                        )
                    continue
                except Exception:
                    failed(driver)
            self.add(driver, done, failed_items, given_back)  # next time, then


@dataclass
class Chores:
    """When the heartbeat thread next does each of its chores (``time.monotonic()`` seconds)."""

    drivers: dict[AnyDriver, float]  # renew the leases and beat, per driver
    reap: float  # the reaper's upkeep
    flush: float  # write the throughput counts
    tick: float  # claim the schedules' due ticks
    process: float = 0.0  # the worker process's own row
    cleanup: float = 0.0  # look for a transaction that holds back cleanup of the queue tables

    def next_due(self) -> float:
        return min([*self.drivers.values(), self.reap, self.process, self.flush, self.tick, self.cleanup])


class Batch:
    """One claimed batch as it runs: how its items ended, and when each stage began."""

    def __init__(self, driver: AnyDriver, items: list[Any], claimed_at: float, *, trace: bool) -> None:
        self.driver = driver
        self.items = items
        self.trace = trace  # debug logging: every item named as it starts and ends
        # time.monotonic() when the claim began, when the handler began, when it ended.
        self.claimed_at = claimed_at
        self.running_at = time.monotonic()
        self.ran_at = self.running_at
        self.finished: list[Any] = []  # returned, or failed for good: settled as done
        self.settled: set[Any] = set()  # keys of the items settled (or to be) by this batch
        self.started = self.done = self.failed = 0


def outcome(error: FailedForGood) -> str:
    """Return what became of an item that failed for good, as its log line says it after
    "failed": `` (attempt 1 of 3), retrying in 4 s`` (the Django Tasks backend's words), or
    ``""`` when the message says no more than that it failed."""
    said = getattr(error, "outcome", None)
    if isinstance(said, str):
        return f" {said}"
    found = re.search(r" failed( \(attempt .*)$", str(error))
    return found.group(1) if found else ""


def progress_key(driver: AnyDriver, item: Any) -> tuple[str, str, str]:
    """Name ``item`` in the progress store as its Failure rows do: ``(kind, queue, item)``."""
    return (driver.queue_kind, driver.queue, driver.failure_item(item))


def count(n: int, noun: str) -> str:
    """``1 task``, ``2 tasks``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
