#!/usr/bin/env bash
# Run the demo on a SQLite file: migrate, create demo data, run workers, show that work moved.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
extras=test
# mysqlclient compiles against the MariaDB/MySQL client library: only when it is used.
case "${DATABASE_URL:-}" in mysql*) extras=test,mysql ;; esac
stamp="$VENV/.installed-$extras-$(cksum < pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[$extras]"
  touch "$stamp"
fi
"$VENV/bin/python" testproject/manage.py migrate --no-input -v 0
exec "$VENV/bin/python" testproject/manage.py demo "$@"
