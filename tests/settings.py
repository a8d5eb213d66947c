"""Settings of the test suite: the demo project plus test-only models.

``DATABASE_URL`` picks the database (default SQLite). ``TASKLOOP_TEST_SUFFIX`` names the test
databases so that several runs can share one server without clobbering each other.
"""

import os
import tempfile

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]

# Unless named, a suffix of this run's own (its process id), set in the environment so that
# the worker processes the tests start agree on it: two runs at once never share a database.
SUFFIX = os.environ.setdefault("TASKLOOP_TEST_SUFFIX", f"p{os.getpid()}")
# Tests spread over several pytest processes (run-tests.sh -n): each names its own databases,
# throwaway servers' ports and temporary files (pytest-django suffixes only the databases).
_XDIST = os.environ.get("PYTEST_XDIST_WORKER", "")
if _XDIST and not SUFFIX.endswith(_XDIST):
    SUFFIX = os.environ["TASKLOOP_TEST_SUFFIX"] = f"{SUFFIX}{_XDIST}"
TMP = tempfile.gettempdir()  # run-tests.sh points TMPDIR at a directory it removes afterwards

_default = DATABASES["default"]
if "sqlite" in _default["ENGINE"]:
    # A file, not memory: the concurrency tests open it from other processes.
    _default["TEST"] = {"NAME": f"{TMP}/taskloop_test_{SUFFIX}.sqlite3"}
    _other = {
        **_default,
        "NAME": f"{TMP}/unused_other.sqlite3",
        "TEST": {"NAME": f"{TMP}/taskloop_test_{SUFFIX}_other.sqlite3"},
    }
else:
    _default["TEST"] = {"NAME": f"test_taskloop_{SUFFIX}"}
    _other = {**_default, "TEST": {"NAME": f"test_taskloop_{SUFFIX}_other"}}

# A second alias, to prove that nothing strays from the database it is routed to.
DATABASES["other"] = _other

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# As in production: pytest-django turns DEBUG off in the test process; the worker processes the
# tests start read these settings, and under DEBUG every statement they sent was formatted and
# kept (a drain of thousands of tasks paid for it in CPU that the other tests wanted).
DEBUG = False
