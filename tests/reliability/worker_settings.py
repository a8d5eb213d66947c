"""Settings of the reliability tests' worker subprocesses: the worker tests' settings plus the
app holding the reliability handlers (``TASKLOOP_OVERRIDES`` works as there)."""

from tests.workers_settings import *  # noqa: F403
from tests.workers_settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.reliability.workerapp"]
