"""Settings of worker subprocesses in the tests: the suite's settings, plus TASKLOOP overrides
passed as JSON in ``TASKLOOP_OVERRIDES`` (short backoffs and grace periods keep tests fast)."""

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import TASKLOOP

TASKLOOP = {**TASKLOOP, **json.loads(os.environ.get("TASKLOOP_OVERRIDES", "{}"))}

# A short SQLite busy timeout for the tests that hold the write lock against a worker.
if os.environ.get("TASKLOOP_TEST_SQLITE_TIMEOUT") and "sqlite" in DATABASES["default"]["ENGINE"]:  # noqa: F405
    DATABASES["default"]["OPTIONS"] = {  # noqa: F405
        **DATABASES["default"].get("OPTIONS", {}),  # noqa: F405
        "timeout": float(os.environ["TASKLOOP_TEST_SQLITE_TIMEOUT"]),
    }
