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
