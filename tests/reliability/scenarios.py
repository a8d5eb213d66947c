"""Functions the reliability tests run in fresh Django processes (``remote.run_remote``) on a
throwaway server, possibly inside a test host's network namespace."""

from __future__ import annotations

from collections import Counter
from typing import Any


def fill_tube(n: int, ttr: float = 3.0) -> int:
    """Create tube ``r-tube`` (as its handler does) with ``n`` ready tasks; return the count."""
    from django_taskloop.models import Task, Tube

    tube = Tube.objects.create_tube("r-tube", "fifottl", ttr=ttr, if_not_exists=True)
    first = [tube.put({"n": i}) for i in range(min(n, 10))]
    # The rest are the rows put() writes on a fifottl tube, in bulk (put() one by one is slow).
    Task.objects.bulk_create(
        [Task(tube=tube, data={"n": i}, state="r", pri=0, ttr=ttr) for i in range(len(first), n)],
        batch_size=2000,
    )
    return tube.statistics()["tasks"]["ready"]


def tube_report() -> dict[str, Any]:
    """The tube's statistics and how often each task ran (from the handlers' WorkLog)."""
    from django_taskloop.models import Tube
    from tests.testapp.models import WorkLog

    tube = Tube.objects.get(name="r-tube")
    runs = Counter(WorkLog.objects.filter(kind="r-tube").values_list("key", "pid"))
    per_key: Counter[str] = Counter()
    pids: dict[str, list[int]] = {}
    for (key, pid), n in runs.items():
        per_key[key] += n
        pids.setdefault(key, []).append(pid)
    return {
        "stats": tube.statistics(),
        "keys": len(per_key),
        "runs": sum(per_key.values()),
        "twice": {key: pids[key] for key, n in per_key.items() if n > 1},
    }
