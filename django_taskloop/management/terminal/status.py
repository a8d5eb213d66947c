"""``taskloop status``: every queue's counts by state, latency, pause, failures, workers.

Read from the read model (:func:`django_taskloop.stats.queue_summaries`, Django Tasks queues
merged under their Django names), as the admin's dashboard and the metrics are. One table per
kind of queue, each with that kind's own states as columns.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterable, Sequence
from io import TextIOBase
from typing import Any

from django.db import DatabaseError, connections

from django_taskloop import shards
from django_taskloop.models import WorkerProcess
from django_taskloop.queues import Queue
from django_taskloop.stats import (
    DJANGO_TASK,
    DJANGO_TASK_STATES,
    JOB_STATES,
    LOOP_STATES,
    TASK_STATES,
    ItemProgress,
    QueueSummary,
    merge_django_tasks,
    queue_summaries,
    running_progress,
    shown_queue,
    workers_serving,
)
from django_taskloop.stopping import StopEvent
from django_taskloop.workers.outage import describe

from .text import WIDTH, clip, duration, plural, table

__all__ = ["status_lines", "status_json", "summaries", "watch"]

#: The tables, in order: (kind, title, states as columns).
SECTIONS = (
    ("task", "Tubes", TASK_STATES),
    (DJANGO_TASK, "Django Tasks", DJANGO_TASK_STATES),
    ("job", "Job boards", JOB_STATES),
    ("loop", "Loops", LOOP_STATES),
)


#: Each state of each queue is counted up to this many rows (shown ``100000+``), so that a
#: watched status stays cheap on tables of millions; ``--exact`` counts them all.
COUNT_CAP = 100_000


def summaries(
    queues: Iterable[Queue] = (), *, cap: int | None = COUNT_CAP, down: dict[str, str] | None = None
) -> list[QueueSummary]:
    """Return the summary of every queue, or only of ``queues`` (counts up to ``cap``;
    ``down``: filled with the databases that could not be read)."""
    wanted = {(q.kind, q.name) for q in queues}
    found = merge_django_tasks(queue_summaries(cap=cap, down=down))
    # A queue by its name: every shard of it; ``emails@queue2``: that shard.
    return [s for s in found if not wanted or {(s.kind, s.name), (s.kind, s.title)} & wanted]


def _count(summary: QueueSummary, state: str) -> str:
    n = summary.counts.get(state, 0)
    shown = f"{n}+" if state in summary.capped else str(n)
    # A limited tube's taken tasks against its limit: "5/5", every slot in use.
    return f"{shown}/{summary.limit}" if state == "taken" and summary.limit is not None else shown


def _rate(summary: QueueSummary) -> str:
    """A tube's rate with what its window holds: ``12 of 60/s``; ``—`` without one."""
    return "—" if summary.rate is None else f"{summary.started or 0} of {summary.rate}"


def _per_key(summary: QueueSummary) -> str:
    """A utube's key limit and key rate: ``3 at once, 10/m``; ``—`` without either."""
    shown = [f"{summary.key_limit} at once"] if summary.key_limit is not None else []
    shown += [str(summary.key_rate)] if summary.key_rate is not None else []
    return ", ".join(shown) or "—"


def _row(
    summary: QueueSummary, states: tuple[str, ...], workers: int, rates: bool = False, keys: bool = False
) -> list[str]:
    # The columns a table has where one of its tubes has a rate, a key limit or a key rate.
    extra = ([_rate(summary)] if rates else []) + ([_per_key(summary)] if keys else [])
    if summary.down is not None:  # nothing known of it but where it lives
        return [
            shards.shown(summary.name, summary.using),
            *("—" for _ in states),
            *("—" for _ in extra),
            "—",
            "—",
            str(workers),
            "down",
        ]
    return [
        shards.shown(summary.name, summary.using),  # a shard other than the router's: emails@queue2
        *(_count(summary, state) for state in states),
        *extra,
        duration(summary.oldest_ready) if summary.oldest_ready is not None else "—",
        str(summary.failures_last_hour),
        str(workers),
        "paused" if summary.paused else "running",
    ]


def status_lines(
    found: list[QueueSummary], serving: dict[tuple[str, str], int], down: dict[str, str] | None = None
) -> list[str]:
    """Return the status tables of ``found`` (``serving``: live workers per queue; ``down``:
    the databases that could not be read, each named in a line of its own)."""
    unreachable = [
        f"database {describe(alias)} is unreachable ({why})" for alias, why in (down or {}).items()
    ]
    if not found:
        return ["No queues yet: no tube, job board, Django Tasks queue or loop model.", *unreachable]
    lines: list[str] = []
    for kind, title, states in SECTIONS:
        mine = [s for s in found if s.kind == kind]
        if not mine:
            continue
        # Each table's name column as wide as its own names (a long loop label widens the loops'
        # table only): what fits WIDTH does.
        header = [title.upper(), *(s.upper().replace("_", " ") for s in states)]
        # RATE, where a tube has one: taken in its window against it ("12 of 60/s").
        rates = any(s.rate is not None for s in mine)
        header += ["RATE"] if rates else []
        # PER KEY, where a utube has a key limit or a key rate: "3 at once, 10/m".
        keys = any(s.key_limit is not None or s.key_rate is not None for s in mine)
        header += ["PER KEY"] if keys else []
        # LATENCY: how long the next item to run has waited (Sidekiq's word for it).
        header += ["LATENCY", "FAILED 1H", "WORKERS", "STATE"]
        rows = [_row(s, states, serving.get((s.kind, s.name), 0), rates, keys) for s in mine]
        numbers = range(1, len(header) - 1)
        if lines:
            lines.append("")
        lines += table(header, rows, right=numbers)
    paused = sum(1 for s in found if s.paused)
    failed = sum(s.failures_last_hour for s in found)
    alive = WorkerProcess.objects.alive().count()
    # A sharded queue is one queue in several rows (one per shard).
    queues = len({(s.kind, s.name) for s in found})
    spread = f" in {len(found)} shards" if queues < len(found) else ""
    counts = (
        f"{plural(queues, 'queue')}{spread} ({paused} paused), {plural(failed, 'failure')} in the last hour, "
        f"{plural(alive, 'live worker process', 'live worker processes')}"
    )
    at = f"at {found[0].now:%Y-%m-%d %H:%M:%S %Z}"
    footer = [f"{counts}; {at}"] if len(counts) + len(at) + 2 <= WIDTH else [f"{counts};", at]
    return [*lines, "", *footer, *unreachable]


def _queue_of(entry: ItemProgress) -> tuple[str, str]:
    """``(kind, queue)`` of a progress entry as the tables name it."""
    return shown_queue(entry.kind, entry.queue)


def in_progress(found: list[QueueSummary]) -> list[ItemProgress]:
    """What the handlers running now reported (``progress.report``), on the queues of ``found``."""
    shown = {(s.kind, s.name) for s in found}
    return [entry for entry in running_progress() if _queue_of(entry) in shown]


def progress_lines(entries: list[ItemProgress]) -> list[str]:
    """The "in progress" table: one row per running item that reported its progress."""
    if not entries:
        return []
    header = ["IN PROGRESS", "ITEM", "DONE", "MESSAGE", "WORKER"]
    rows = [
        [_queue_of(e)[1], clip(e.item, 24), f"{e.fraction:.0%}", e.message, clip(e.worker, 24)]
        for e in entries
    ]
    # The message takes what the other columns leave of the terminal's width (20 at least).
    widths = [max(len(row[i]) for row in [header, *rows]) for i in (0, 1, 2, 4)]
    room = max(20, WIDTH - sum(widths) - 2 * 4)
    rows = [[*row[:3], clip(row[3], room), row[4]] for row in rows]
    return ["", *table(header, rows, right=[2])]


def _as_json(summary: QueueSummary, workers: int) -> dict[str, Any]:
    return {
        "kind": summary.kind,
        "name": summary.name,
        "using": summary.using,
        "counts": summary.counts,
        "capped": sorted(summary.capped),
        "oldest_ready_seconds": summary.oldest_ready,
        "paused": summary.paused,
        "limit": summary.limit,
        "rate": None if summary.rate is None else str(summary.rate),
        "rate_used": summary.started,
        "key_limit": summary.key_limit,
        "key_rate": None if summary.key_rate is None else str(summary.key_rate),
        "failures_last_hour": summary.failures_last_hour,
        "workers": workers,
        "tubes": [tube.name for tube in summary.tubes],
        "now": summary.now.isoformat(),
        "down": summary.down,
    }


def status_json(
    found: list[QueueSummary],
    serving: dict[tuple[str, str], int],
    *,
    indent: int | None = 2,
    progress: Sequence[ItemProgress] = (),
    down: dict[str, str] | None = None,
) -> str:
    """Return the status of ``found`` as JSON: ``{"queues": [...], "progress": [...], "down":
    {alias: reason}}`` (the databases that could not be read)."""
    queues = [_as_json(s, serving.get((s.kind, s.name), 0)) for s in found]
    running = [
        {
            "kind": _queue_of(e)[0],
            "queue": _queue_of(e)[1],
            "item": e.item,
            "fraction": e.fraction,
            "message": e.message,
            "worker": e.worker,
            "at": None if e.at is None else e.at.isoformat(),
        }
        for e in progress
    ]
    return json.dumps({"queues": queues, "progress": running, "down": down or {}}, indent=indent)


def render(queues: list[Queue], as_json: bool, *, exact: bool = False, indent: int | None = 2) -> str:
    """Return the status of ``queues`` (every queue if empty), as text or JSON."""
    down: dict[str, str] = {}
    found = summaries(queues, cap=None if exact else COUNT_CAP, down=down)
    serving = workers_serving()
    running = in_progress(found)
    if as_json:
        return status_json(found, serving, indent=indent, progress=running, down=down)
    return "\n".join([*status_lines(found, serving, down), *progress_lines(running)])


#: Clear the screen and go home: a watched status refreshes in place on a terminal.
CLEAR = "\x1b[H\x1b[2J"


def watch(every: float, draw: Callable[[], str], out: TextIOBase, *, tty: bool) -> None:
    """Write ``draw()`` every ``every`` seconds until SIGINT or SIGTERM (a second one ends a
    refresh in the middle); in place on a tty, as blocks one after another otherwise."""
    stop = StopEvent()  # (not a threading.Event: see StopEvent)

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():  # a second one: stop now, even in the middle of a slow read
            raise SystemExit(128 + signum)
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        first = True
        while not stop.is_set():
            try:
                block = draw()
            except DatabaseError as error:
                # The database went away: say so and try again, as a dashboard would.
                connections.close_all()
                block = f"Cannot read the queues: {str(error).splitlines()[0] if str(error) else error!r}"
            out.write((CLEAR if tty else "" if first else "\n") + block + "\n")
            out.flush()
            first = False
            stop.wait(every)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
