"""System checks: taskloop.E001 for a MySQL/MariaDB without SKIP LOCKED."""

from __future__ import annotations

import pytest
from django.db import connection

from django_taskloop.checks import check_skip_locked

pytestmark = pytest.mark.django_db


def test_supported_database_passes():
    assert check_skip_locked(databases=["default"]) == []


def test_server_without_skip_locked_gets_e001(monkeypatch, vendor):
    if vendor == "sqlite":
        # SQLite never row-locks; the check is about MySQL/MariaDB/PostgreSQL servers.
        assert check_skip_locked(databases=["default"]) == []
        return
    connection.ensure_connection()
    # What Django reports for MySQL < 8.0.1 or MariaDB < 10.6.
    monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", False)
    errors = check_skip_locked(databases=["default"])
    assert [e.id for e in errors] == ["taskloop.E001"]
    assert "MariaDB 10.6" in errors[0].hint


def test_no_databases_no_queries():
    assert check_skip_locked(databases=None) == []
