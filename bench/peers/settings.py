"""Settings of the peers' benchmark project. ``PEER`` picks the system, ``DATABASE_URL`` the database.

PEER=tasksdb | q2 | djqueue
DATABASE_URL=mysql://root@127.0.0.1:3306/bench_q2   (default: SQLite at $BENCH_SQLITE)
BENCH_PROCESSES=4                                     (worker processes of qcluster / dj_queue)
"""

import os

import dj_database_url

PEER = os.environ["PEER"]
PROCESSES = int(os.environ.get("BENCH_PROCESSES", "1"))

SECRET_KEY = "bench-only"
# DEBUG off: with it on, Django keeps every query in memory.
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "benchpeer"]

url = os.environ.get("DATABASE_URL") or "sqlite:///" + os.environ.get(
    "BENCH_SQLITE", f"/tmp/bench_{PEER}.sqlite3"
)
DATABASES = {"default": dj_database_url.parse(url)}
if "sqlite" in DATABASES["default"]["ENGINE"]:
    DATABASES["default"]["OPTIONS"] = {"timeout": 30}

if PEER == "tasksdb":
    INSTALLED_APPS += ["django_tasks", "django_tasks_db"]
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
elif PEER == "djqueue":
    INSTALLED_APPS += ["dj_queue"]
    DATABASE_ROUTERS = ["dj_queue.routers.DjQueueRouter"]
    TASKS = {
        "default": {
            "BACKEND": "dj_queue.backend.DjQueueBackend",
            "QUEUES": [],
            "OPTIONS": {
                # Its defaults, with one thread per process so that "processes" compares
                # like with like (no-op jobs gain nothing from threads under the GIL).
                "workers": [{"queues": "*", "threads": 1, "processes": PROCESSES, "polling_interval": 0.1}],
                "preserve_finished_jobs": True,
            },
        }
    }
elif PEER == "q2":
    INSTALLED_APPS += ["django_q"]
    # The ORM broker with its defaults (poll 0.2 s, one task per dequeue).
    Q_CLUSTER = {
        "name": "bench",
        "orm": "default",
        "workers": PROCESSES,
        "timeout": 60,
        "retry": 120,
        "max_attempts": 1,
        "catch_up": False,
        "log_level": "WARNING",
    }
else:
    raise ValueError(f"unknown PEER {PEER!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
