"""Settings of our benchmark project. ``DATABASE_URL`` picks the database (default: SQLite at
``$BENCH_SQLITE``)."""

import json
import os

import dj_database_url

SECRET_KEY = "bench-only"
# DEBUG off: with it on, Django keeps every query in memory.
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_taskloop", "benchapp"]

url = os.environ.get("DATABASE_URL") or "sqlite:///" + os.environ.get(
    "BENCH_SQLITE", "/tmp/bench_taskloop.sqlite3"
)
DATABASES = {"default": dj_database_url.parse(url)}
if "sqlite" in DATABASES["default"]["ENGINE"]:
    # WAL, as the raw baseline runs it (and as docs/operating.md recommends for workers on
    # SQLite): readers do not wait for the writer, and a commit appends instead of rewriting.
    DATABASES["default"]["OPTIONS"] = {"timeout": 30, "init_command": "PRAGMA journal_mode=WAL"}
if "mysql" in DATABASES["default"]["ENGINE"]:
    DATABASES["default"]["OPTIONS"] = {"charset": "utf8mb4"}
if "postgresql" in DATABASES["default"]["ENGINE"] and os.environ.get("BENCH_PG_PREPARED"):
    # For bench/profile_put.py: psycopg's server-side binding with prepared statements (off by
    # default in Django: they need PgBouncer 1.21+ with max_prepared_statements, or none).
    DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5}

# TASKLOOP overrides for an experiment, e.g. BENCH_TASKLOOP='{"BATCH_TIME": 0}' (fixed batches).
TASKLOOP: dict = json.loads(os.environ.get("BENCH_TASKLOOP", "{}"))

# Django Tasks through our backend, for the enqueue scenario (the backport on Django 5.2).
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")
TASKS = {"default": {"BACKEND": "django_taskloop.backends.TaskloopBackend", "QUEUES": ["default", "kinds"]}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}

# The latency scenario counts what its idle worker sends (TASKLOOP_STATEMENT_LOG names the file).
from statement_log import install  # noqa: E402

install()
