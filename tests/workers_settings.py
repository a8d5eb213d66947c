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

# The Django Tasks backend's OPTIONS, added to as JSON in TASKLOOP_TASKS_OPTIONS (a queue's
# LIMITS or RATES: tests/test_task_queue_limits.py).
if os.environ.get("TASKLOOP_TASKS_OPTIONS"):
    from tests.settings import TASKS

    TASKS = {
        **TASKS,
        "default": {
            **TASKS["default"],
            "OPTIONS": {
                **TASKS["default"].get("OPTIONS", {}),
                **json.loads(os.environ["TASKLOOP_TASKS_OPTIONS"]),
            },
        },
    }
