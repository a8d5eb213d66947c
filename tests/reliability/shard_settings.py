"""Settings of the shard tests' processes: the reliability workers' settings, with tube
``r-shards`` spread over ``default`` (``DATABASE_URL``) and one alias per URL in
``TASKLOOP_SHARD_URLS`` (``shard1``, ``shard2``, …; comma-separated)."""

import os

from testproject.settings import database_from_url

from tests.reliability.worker_settings import *  # noqa: F403
from tests.reliability.worker_settings import DATABASES, TASKLOOP

_urls = [url for url in os.environ.get("TASKLOOP_SHARD_URLS", "").split(",") if url]
for _n, _url in enumerate(_urls, start=1):
    DATABASES[f"shard{_n}"] = database_from_url(_url)

TASKLOOP = {**TASKLOOP, "SHARDS": {"r-shards": ["default", *(f"shard{n}" for n in range(1, len(_urls) + 1))]}}
