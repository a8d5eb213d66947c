"""What the shard tests run in a process of their own (``tests.reliability.shard_settings``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

#: Keys of the keyed tasks: each key's tasks must run in the order they were put.
KEYS = 60


def fill(per_key: int) -> dict[str, int]:
    """Put ``per_key`` tasks under each of :data:`KEYS` utube keys on the sharded tube; return
    how many each shard holds."""
    from django_taskloop import shards

    tube = shards.tube("r-shards", type="utubettl", ttr=3)
    held: dict[str, int] = defaultdict(int)
    for k in range(KEYS):
        key = f"k{k}"
        tasks = tube.put_many([{"key": key, "seq": seq} for seq in range(per_key)], utube=key)
        held[tasks[0]._state.db] += len(tasks)
    return dict(held)


def report() -> dict[str, Any]:
    """The shards' statistics, how often each task ran, and the keys whose first runs came out
    of order (from the handlers' WorkLog, in the default database)."""
    from django_taskloop import shards
    from tests.testapp.models import WorkLog

    runs: dict[str, int] = defaultdict(int)
    firsts: dict[str, list[int]] = defaultdict(list)
    for key in WorkLog.objects.filter(kind="r-shards").order_by("id").values_list("key", flat=True):
        runs[key] += 1
        if runs[key] == 1:
            utube, _, seq = key.partition(":")
            firsts[utube].append(int(seq))
    stats = shards.tube("r-shards").statistics(apply_transitions=False)
    return {
        "stats": {group: stats[group] for group in ("tasks", "calls")},
        "shards": {alias: shard["tasks"] for alias, shard in stats["shards"].items()},
        "keys": len(runs),
        "runs": sum(runs.values()),
        "out_of_order": sorted(key for key, seqs in firsts.items() if seqs != sorted(seqs)),
    }


def timed_puts(count: int, key: str | None = None) -> list[dict[str, Any]]:
    """Put ``count`` tasks on the sharded tube (under ``key`` if given, else each to the next
    shard in turn); return each put's shard, seconds, and error (its first line) if it failed."""
    import time

    from django_taskloop import shards

    tube = shards.tube("r-shards", type="utubettl", ttr=3)
    done: list[dict[str, Any]] = []
    for n in range(count):
        started = time.monotonic()
        try:
            task = tube.put({"key": key or f"free{n}", "seq": n}, **({"utube": key} if key else {}))
            done.append({"shard": task._state.db, "seconds": time.monotonic() - started, "error": None})
        except Exception as error:  # the test reads what it was
            first = str(error).splitlines()[0] if str(error) else ""
            done.append(
                {
                    "shard": None,
                    "seconds": time.monotonic() - started,
                    "error": f"{type(error).__name__}: {first}",
                }
            )
    return done


def key_on(alias: str) -> str:
    """A utube key whose tasks live on shard ``alias``."""
    from django_taskloop import shards

    databases = shards.databases_of("r-shards")
    return next(f"pinned{n}" for n in range(1000) if shards.pick(databases, f"pinned{n}") == alias)
