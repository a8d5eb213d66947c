"""Settings of worker subprocesses in the tests: the suite's settings, plus TASKLOOP overrides
passed as JSON in ``TASKLOOP_OVERRIDES`` (short backoffs and grace periods keep tests fast)."""

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import TASKLOOP

TASKLOOP = {**TASKLOOP, **json.loads(os.environ.get("TASKLOOP_OVERRIDES", "{}"))}
