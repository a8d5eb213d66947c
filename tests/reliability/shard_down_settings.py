"""Settings of the down-shard tests' processes: :mod:`shard_settings` (tube ``r-shards`` over
``default``, ``shard1``, ``shard2``, …), with board ``r-board`` spread the same way and the
Django Tasks backend's queues over the same databases (``OPTIONS["DATABASES"]``)."""

from tests.reliability.shard_settings import *  # noqa: F403
from tests.reliability.shard_settings import TASKLOOP, TASKS

_aliases = TASKLOOP["SHARDS"]["r-shards"]
TASKLOOP = {**TASKLOOP, "SHARDS": {**TASKLOOP["SHARDS"], "r-board": list(_aliases)}}
TASKS = {
    alias: {**backend, "OPTIONS": {**backend.get("OPTIONS", {}), "DATABASES": list(_aliases)}}
    for alias, backend in TASKS.items()
}
