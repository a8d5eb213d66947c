#!/usr/bin/env bash
# Run the test suite in a virtualenv of its own: bash run-tests.sh [pytest args]
#   DATABASE_URL            picks the database (default: a SQLite file in a temporary directory)
#   PYTHON                  the interpreter (default python3; Django 6 needs 3.12+)
#   VENV                    where the virtualenv lives (default .venv)
#   TASKLOOP_START_SERVERS  1: also run the tests that start throwaway MariaDB/PostgreSQL servers
#                           and network namespaces (needs root; .ci/run sets it). Without it
#                           nothing is started and the machine's network is left alone.
# Each run uses databases and temporary files of its own (removed at the end), so two runs at
# once on one machine do not collide.
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
export TASKLOOP_TEST_SUFFIX="${TASKLOOP_TEST_SUFFIX:-run$$}"
TMPDIR="$(mktemp -d "${TMPDIR:-/tmp}/taskloop-tests.XXXXXX")"
chmod 755 "$TMPDIR"  # the throwaway PostgreSQL server runs as postgres and lives in here
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
"$VENV/bin/python" -m pytest --basetemp="$TMPDIR/pytest" "$@"
