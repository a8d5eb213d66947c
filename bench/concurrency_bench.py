"""Many items at a time in one worker process (issue 44's rows): ``workers --concurrency N``.

    DATABASE_URL=postgres:///bench_taskloop python bench/concurrency_bench.py [--tasks 200] [--concurrency 50]

Rows, on the database ``DATABASE_URL`` names, each a real ``manage.py workers --burst``:

- ``--tasks`` tasks that each ``await asyncio.sleep(1)`` (an ``async def`` handler), then as
  many that each ``time.sleep(1)`` (a sync one), drained by one process with ``--concurrency
  N``; and a few of each at ``--concurrency 1``, today's one item at a time. Printed: the
  command's wall seconds (start-up included), the seconds from the first handler start to the
  last one's end, the most items that ran at once, and whether each ran exactly once.
- The no-op drain (``--drain`` tasks, the ``bench`` tube) at ``--concurrency 1`` and without the
  option, in alternate rounds: the option must cost nothing when it is 1.

Then the load average. No timing is asserted: these are measurements (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios  # noqa: E402  (sets Django up with the bench project)
from common import check_once, drain_rate, fresh_dir, most_at_once, read_records  # noqa: E402
from django.db import connections  # noqa: E402

from django_taskloop.models import Tube  # noqa: E402


def burst(only: str, concurrency: int | None, record_dir: Path, processes: int = 1) -> float:
    """Run ``workers --burst --processes P --only ONLY [--concurrency N]``; return its wall
    seconds."""
    connections.close_all()
    command = scenarios.workers_command(processes, True, only)
    if concurrency is not None:
        command += ["--concurrency", str(concurrency)]
    env = {**os.environ, scenarios.RECORD_DIR_ENV: str(record_dir)}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"workers failed:\n{done.stderr[-3000:]}")
    return wall


def waits(name: str, tasks: int, concurrency: int, seconds: float) -> dict:
    """Drain ``tasks`` tasks of tube ``name`` that each wait ``seconds``."""
    tube = Tube.objects.create_tube(name, "fifottl", if_not_exists=True)
    tube.truncate()
    tube.put_many([[n, seconds] for n in range(tasks)])
    record_dir = fresh_dir(Path(tempfile.gettempdir()) / f"concurrency-{name}-{concurrency}")
    wall = burst(name, concurrency, record_dir)
    records = read_records(record_dir)
    starts = sorted(at for _n, at in records)
    return {
        "wall": wall,
        "window": (starts[-1] + seconds - starts[0]) if starts else 0.0,
        # Each item ends ``seconds`` after it started: the most at once from the starts alone.
        "most": most_at_once(starts, seconds),
        **check_once(records, range(tasks)),
    }


def noop_drain(jobs: int, concurrency: int | None) -> float:
    tube = scenarios.empty_tube()
    scenarios.fill(tube, range(jobs))
    record_dir = fresh_dir(Path(tempfile.gettempdir()) / f"concurrency-drain-{concurrency}")
    burst(scenarios.TUBE, concurrency, record_dir)
    records = read_records(record_dir)
    assert check_once(records, range(jobs))["exactly_once"]
    return drain_rate(records)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--one-at-a-time", type=int, default=5, help="tasks of the --concurrency 1 rows")
    parser.add_argument("--drain", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    print(f"{connections['default'].vendor}: {args.tasks} tasks of 1 s each, one process\n")
    print(
        f"{'handler':<22} {'concurrency':>11} {'tasks':>6} {'wall s':>8} {'first start→last end s':>23} "
        f"{'most at once':>12}  once"
    )
    for name, what in (("bench-await", "await asyncio.sleep"), ("bench-wait", "time.sleep")):
        for concurrency, tasks in ((args.concurrency, args.tasks), (1, args.one_at_a_time)):
            row = waits(name, tasks, concurrency, 1.0)
            print(
                f"{what:<22} {concurrency:>11} {tasks:>6} {row['wall']:>8.2f} {row['window']:>23.2f} "
                f"{row['most']:>12}  {row['exactly_once']}"
            )
    load.append(os.getloadavg()[0])
    rates: dict[str, list[float]] = {"--concurrency 1": [], "no option": []}
    for _ in range(args.rounds):
        rates["--concurrency 1"].append(noop_drain(args.drain, 1))
        rates["no option"].append(noop_drain(args.drain, None))
    print(f"\nno-op drain, {args.drain} tasks, one process, jobs/s (median of {args.rounds}; min–max):")
    for label, values in rates.items():
        print(f"  {label:<16} {statistics.median(values):>9,.0f} ({min(values):,.0f}–{max(values):,.0f})")
    ratio = statistics.median(rates["--concurrency 1"]) / statistics.median(rates["no option"])
    print(f"  ratio {ratio:.2f}")
    load.append(os.getloadavg()[0])
    print(f"\nload average (1 min) {' → '.join(f'{value:.2f}' for value in load)}")


if __name__ == "__main__":
    main()
