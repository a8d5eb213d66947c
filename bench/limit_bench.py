"""A tube's running limit and rate (issue 44 §2's rows): ``@tube(limit=5)``, ``@tube(rate="60/s")``
and what each costs a take.

    DATABASE_URL=postgres:///bench_taskloop python bench/limit_bench.py [--tasks 60] [--seconds 0.5]

Rows, on the database ``DATABASE_URL`` names:

- ``--tasks`` tasks of the ``bench-limited`` tube (``limit=5``) that each ``time.sleep``
  ``--seconds``, drained by a real ``manage.py workers --burst --processes 4 --concurrency 10``
  (40 slots for 5 places). Printed: the most that ran at once (from the handlers' start
  records, each running ``--seconds``), the seconds from the first start to the last end, and
  that against five ideal slots (``tasks × seconds / 5``).
- ``--paced`` tasks of the ``bench-paced`` tube (``rate="60/s"``) that each sleep 10 ms,
  drained the same way. Printed: the most started in any 1 s (from the start records), and the
  rate kept: the starts after the first window, over the seconds from the first start to the
  last (``(tasks - 60) / 60`` s at an ideal 60/s: the last window's starts come at its start).
- What a limit or a rate costs a take: ``take_many(10)`` and ``ack_many`` of what it took, in
  this process, on a tube with neither, with a limit that never binds (1,000,000) and with a
  rate that never binds (1,000,000/s), in alternate rounds: µs per take (median of the rounds)
  and client CPU. The same on a utubettl tube whose tasks each have a key of their own: its own
  rule, a key limit and a key rate that never bind (``--costs-only``: these rows alone).

Then the load average. No timing is asserted: these are measurements (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios  # noqa: E402  (sets Django up with the bench project)
from common import check_once, fresh_dir, most_at_once, read_records  # noqa: E402
from concurrency_bench import burst  # noqa: E402
from django.db import connections  # noqa: E402

from django_taskloop.models import Tube  # noqa: E402


def limited_drain(tasks: int, seconds: float) -> dict:
    tube = Tube.objects.create_tube("bench-limited", "fifottl", if_not_exists=True)
    tube.truncate()
    tube.put_many([[n, seconds] for n in range(tasks)])
    record_dir = fresh_dir(Path(tempfile.gettempdir()) / "limit-bench")
    burst("bench-limited", 10, record_dir, processes=4)
    records = read_records(record_dir)
    starts = sorted(at for _n, at in records)
    window = starts[-1] + seconds - starts[0]
    return {
        "most": most_at_once(starts, seconds),
        "window": window,
        "ideal": tasks * seconds / 5,
        **check_once(records, range(tasks)),
    }


def most_in_a_second(starts: list[float]) -> int:
    """The most starts in any half-open window of one second."""
    most, first = 0, 0
    for last, at in enumerate(starts):
        while at - starts[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def paced_drain(tasks: int) -> dict:
    tube = Tube.objects.create_tube("bench-paced", "fifottl", if_not_exists=True)
    tube.truncate()
    tube.put_many([[n, 0.01] for n in range(tasks)])
    record_dir = fresh_dir(Path(tempfile.gettempdir()) / "rate-bench")
    burst("bench-paced", 10, record_dir, processes=4)
    records = read_records(record_dir)
    starts = sorted(at for _n, at in records)
    span = starts[-1] - starts[0]
    return {
        "most": most_in_a_second(starts),
        "span": span,
        "kept": (tasks - 60) / span if span else 0.0,
        **check_once(records, range(tasks)),
    }


#: What a fifottl tube's take costs by running limit and rate, none of which binds:
#: (label, limit, rate).
COSTS = (("neither", None, None), ("limit", 1_000_000, None), ("rate", None, "1000000/s"))
#: A utube's takes: its own rule (one of a key at a time), a key limit and a key rate that never
#: bind (each task has a key of its own): (label, key limit, key rate).
KEY_COSTS = (("utube", None, None), ("key limit", 1_000_000, None), ("key rate", None, "1000000/s"))


def take_cost(rounds: int, takes: int) -> dict[str, tuple[float, float]]:
    """µs of wall and client CPU per ``take_many(10)`` + ``ack_many`` of the bench tube, by
    running limit and rate."""
    tube = scenarios.empty_tube()
    return _cost(
        tube, COSTS, tube.set_limit, tube.set_rate, lambda n: tube.put_many(list(range(n))), rounds, takes
    )


def key_cost(rounds: int, takes: int) -> dict[str, tuple[float, float]]:
    """µs of wall and client CPU per ``take_many(10)`` + ``ack_many`` of a utubettl tube whose
    tasks each have a key of their own, by key limit and key rate."""
    from django_taskloop.models import Task, Tube

    tube = Tube.objects.create_tube("bench-keyed", "utubettl", if_not_exists=True, ttr=60)

    def fill(n: int) -> None:
        tasks = [Task(tube=tube, data=i, utube=f"k{i}", state="r", pri=0, ttr=60.0) for i in range(n)]
        Task.objects.bulk_create(tasks, batch_size=2000)

    return _cost(tube, KEY_COSTS, tube.set_key_limit, tube.set_key_rate, fill, rounds, takes)


def _cost(
    tube: Any,
    cases: tuple[tuple[str, Any, Any], ...],
    set_limit: Callable[[Any], None],
    set_rate: Callable[[Any], None],
    fill: Callable[[int], None],
    rounds: int,
    takes: int,
) -> dict[str, tuple[float, float]]:
    """µs of wall and client CPU per ``take_many(10)`` + ``ack_many`` of ``tube`` in each of
    ``cases`` (a label, the limit ``set_limit`` sets and the rate ``set_rate`` sets), in
    alternate rounds; ``fill(n)`` puts ``n`` tasks on the emptied tube. Median of the rounds."""
    results: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label, _l, _r in cases}
    for _ in range(rounds):
        for label, limit, rate in cases:
            tube.truncate()
            set_limit(limit)
            set_rate(rate)
            fill(takes * 10)
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(takes):
                taken = tube.take_many(10, consumer="bench")
                tube.ack_many([task.id for task in taken], consumer="bench")
            results[label][0].append((time.perf_counter() - wall) / takes * 1e6)
            results[label][1].append((time.process_time() - cpu) / takes * 1e6)
    set_limit(None)
    set_rate(None)
    return {label: (statistics.median(w), statistics.median(c)) for label, (w, c) in results.items()}


def _print_costs(title: str, cost: dict[str, tuple[float, float]], rounds: int, takes: int) -> None:
    first = next(iter(cost))
    wall0 = cost[first][0]
    print(f"  {title}: take_many(10) + ack_many, µs (median of {rounds} rounds of {takes}):")
    for label, (wall, cpu) in cost.items():
        added = "" if label == first else f"   (+{wall - wall0:.0f} µs, {wall / wall0:.2f}x)"
        print(f"    {label:9} {wall:8.0f} wall {cpu:6.0f} CPU{added}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--paced", type=int, default=360)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--takes", type=int, default=300)
    parser.add_argument("--costs-only", action="store_true", help="only what a limit or rate costs a take")
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    vendor = connections["default"].vendor
    if args.costs_only:
        _costs(vendor, args, load)
        return
    row = limited_drain(args.tasks, args.seconds)
    print(f"{vendor}: {args.tasks} tasks of {args.seconds} s, limit 5, 4 processes x --concurrency 10")
    print(
        f"  most at once {row['most']}, first start -> last end {row['window']:.2f} s, "
        f"5 ideal slots {row['ideal']:.2f} s ({row['ideal'] / row['window']:.2f} of ideal), "
        f"exactly once {row['exactly_once']}"
    )
    load.append(os.getloadavg()[0])
    paced = paced_drain(args.paced)
    print(f"{vendor}: {args.paced} tasks of 0.01 s, rate 60/s, 4 processes x --concurrency 10")
    print(
        f"  most started in any 1 s {paced['most']}, first -> last start {paced['span']:.2f} s, "
        f"rate kept {paced['kept']:.1f}/s ({paced['kept'] / 60:.2f} of 60/s), "
        f"exactly once {paced['exactly_once']}"
    )
    load.append(os.getloadavg()[0])
    _costs(vendor, args, load)


def _costs(vendor: str, args: argparse.Namespace, load: list[float]) -> None:
    _print_costs(f"{vendor}, a fifottl tube", take_cost(args.rounds, args.takes), args.rounds, args.takes)
    load.append(os.getloadavg()[0])
    _print_costs(f"{vendor}, a utubettl tube", key_cost(args.rounds, args.takes), args.rounds, args.takes)
    load.append(os.getloadavg()[0])
    print(f"load average (1 min) {' -> '.join(f'{value:.2f}' for value in load)}")


if __name__ == "__main__":
    main()
