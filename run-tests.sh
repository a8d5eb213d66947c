#!/usr/bin/env bash
# Run the test suite in a virtualenv of its own: bash run-tests.sh [pytest args]
#   DATABASE_URL            picks the database (default: a SQLite file in a temporary directory)
#   PYTHON                  the interpreter (default python3; Django 6 needs 3.12+)
#   VENV                    where the virtualenv lives (default .venv)
#   DJANGO                  a pip requirement that pins Django (e.g. 'Django~=6.0.0'; default: the
#                           newest that pyproject.toml allows on this Python)
#   TASKLOOP_TEST_PROCESSES how many pytest processes share the tests (default 4: most tests wait
#                           on worker processes, so two per core keep both cores busy); each has
#                           its own databases, ports and temporary files. -n0 (last) runs one.
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
case "${DATABASE_URL:-}" in mysql*) [[ ",$extras," == *,mysql,* ]] || extras=$extras,mysql ;; esac
stamp="$VENV/.installed-$extras-$(printf '%s' "${DJANGO:-}" | cksum | cut -d' ' -f1)-$(cksum < pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[$extras]" ${DJANGO:+"$DJANGO"}
  touch "$stamp"
fi
# Most tests start worker processes, each of which imports the package: with
# PYTHONDONTWRITEBYTECODE set, every one of them compiled it from source again (0.14 s of CPU of
# its 0.74 s). Compiled code is kept under the virtualenv instead, so the tree stays clean.
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$(cd "$VENV" && pwd)/.pycache}"
fi
export TASKLOOP_TEST_SUFFIX="${TASKLOOP_TEST_SUFFIX:-run$$}"
TMPDIR="$(mktemp -d "${TMPDIR:-/tmp}/taskloop-tests.XXXXXX")"
chmod 755 "$TMPDIR"  # the throwaway PostgreSQL server runs as postgres and lives in here
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
# Where tests that start their own servers run, --dist loadgroup keeps them in one process
# (tests/selection.py). Elsewhere --dist worksteal: a process that runs out of tests takes some
# of another's, so that a long test near the end does not leave the others idle (the README's
# command, back to back on one machine: 272 s against 312 s).
dist=worksteal
if [ "${TASKLOOP_START_SERVERS:-}" = 1 ] && [ "${TASKLOOP_SERVER_TESTS:-}" != none ]; then
  dist=loadgroup
fi
"$VENV/bin/python" -m pytest --basetemp="$TMPDIR/pytest" -n "${TASKLOOP_TEST_PROCESSES:-4}" --dist "$dist" "$@"
