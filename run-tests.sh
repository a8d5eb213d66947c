#!/usr/bin/env bash
# Run the test suite in a virtualenv of its own: bash run-tests.sh [pytest args]
#   DATABASE_URL  picks the database (default: SQLite file)
#   PYTHON        the interpreter (default python3; Django 6 needs 3.12+)
#   VENV          where the virtualenv lives (default .venv)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
extras=test${EXTRAS:+,$EXTRAS}   # EXTRAS=browser adds Playwright for the admin's browser test
# mysqlclient compiles against the MariaDB/MySQL client library: only when it is used.
case "${DATABASE_URL:-}" in mysql*) extras=$extras,mysql ;; esac
stamp="$VENV/.installed-$extras-$(cksum < pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[$extras]"
  touch "$stamp"
fi
exec "$VENV/bin/python" -m pytest "$@"
