"""A tube's running limit (issue 44 §2's rows): ``@tube(limit=5)`` and what a limit costs a take.

    DATABASE_URL=postgres:///bench_taskloop python bench/limit_bench.py [--tasks 60] [--seconds 0.5]

Rows, on the database ``DATABASE_URL`` names:

- ``--tasks`` tasks of the ``bench-limited`` tube (``limit=5``) that each ``time.sleep``
  ``--seconds``, drained by a real ``manage.py workers --burst --processes 4 --concurrency 10``
  (40 slots for 5 places). Printed: the most that ran at once (from the handlers' start
  records, each running ``--seconds``), the seconds from the first start to the last end, and
  that against five ideal slots (``tasks × seconds / 5``).
- What a limit costs a take: ``take_many(10)`` and ``ack_many`` of what it took, in this
  process, on a tube with no limit and on the same tube with a limit that never binds
  (1,000,000), in alternate rounds: µs per take (median of the rounds) and client CPU.

Then the load average. No timing is asserted: these are measurements (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

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


def take_cost(rounds: int, takes: int) -> dict[str, tuple[float, float]]:
    """µs of wall and client CPU per ``take_many(10)`` + ``ack_many``, by limit."""
    tube = scenarios.empty_tube()
    results: dict[str, tuple[list[float], list[float]]] = {"no limit": ([], []), "limit": ([], [])}
    for _ in range(rounds):
        for label, limit in (("no limit", None), ("limit", 1_000_000)):
            tube.truncate()
            tube.set_limit(limit)
            tube.put_many(list(range(takes * 10)))
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(takes):
                taken = tube.take_many(10, consumer="bench")
                tube.ack_many([task.id for task in taken], consumer="bench")
            results[label][0].append((time.perf_counter() - wall) / takes * 1e6)
            results[label][1].append((time.process_time() - cpu) / takes * 1e6)
    tube.set_limit(None)
    return {label: (statistics.median(w), statistics.median(c)) for label, (w, c) in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--takes", type=int, default=300)
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    vendor = connections["default"].vendor
    row = limited_drain(args.tasks, args.seconds)
    print(f"{vendor}: {args.tasks} tasks of {args.seconds} s, limit 5, 4 processes x --concurrency 10")
    print(
        f"  most at once {row['most']}, first start -> last end {row['window']:.2f} s, "
        f"5 ideal slots {row['ideal']:.2f} s ({row['ideal'] / row['window']:.2f} of ideal), "
        f"exactly once {row['exactly_once']}"
    )
    load.append(os.getloadavg()[0])
    cost = take_cost(args.rounds, args.takes)
    (wall0, cpu0), (wall1, cpu1) = cost["no limit"], cost["limit"]
    print(f"  take_many(10) + ack_many, µs (median of {args.rounds} rounds of {args.takes}):")
    print(f"    no limit {wall0:8.0f} wall {cpu0:6.0f} CPU")
    print(f"    limit    {wall1:8.0f} wall {cpu1:6.0f} CPU   (+{wall1 - wall0:.0f} µs, {wall1 / wall0:.2f}x)")
    load.append(os.getloadavg()[0])
    print(f"load average (1 min) {' -> '.join(f'{value:.2f}' for value in load)}")


if __name__ == "__main__":
    main()
