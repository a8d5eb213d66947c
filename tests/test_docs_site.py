"""The documentation site (docs/, Sphinx with MyST) builds without a warning, and its settings
reference (docs/settings.md) says what ``django_taskloop/conf.py`` does.

The build runs as CI runs it, ``sphinx-build -W --keep-going -b html docs <dir>``, in a process
of its own; Sphinx comes with the ``docs`` extra, and without it the build's test fails saying
so. The reference's checks need no Sphinx: the types and defaults it shows are read from
conf.py at build time (docs/_ext/settings_reference.py, imported here as the build imports it).
"""

from __future__ import annotations

import html
import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_taskloop.checks import check_settings
from django_taskloop.conf import DEFAULTS, RULES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

sys.path.insert(0, str(DOCS / "_ext"))
import settings_reference as reference  # noqa: E402

#: A Python block of docs/settings.md and the marker that says what it is.
BLOCK = re.compile(r"(?:<!-- docs-test: (\w+) -->\n)?```python\n(.*?)```", re.S)


def test_the_settings_reference_describes_every_key_of_conf_py_and_no_other():
    described = reference.described_keys()
    twice = sorted({key for key in described if described.count(key) > 1})
    assert not twice, f"docs/settings.md describes these keys more than once: {twice}"
    missing = [key for key in DEFAULTS if key not in described]
    assert not missing, f"docs/settings.md does not describe TASKLOOP keys of conf.py: {missing}"
    unknown = [key for key in described if key not in DEFAULTS]
    assert not unknown, f"docs/settings.md describes keys that conf.py does not have: {unknown}"


def test_every_key_of_conf_py_has_a_rule_and_exactly_one_type_in_the_reference():
    assert list(RULES) == list(DEFAULTS)
    for key in DEFAULTS:
        reference.kind_of(key)  # LookupError names the key and what fits


def test_every_default_shown_is_conf_py_s_and_passes_its_own_check():
    for key, value in DEFAULTS.items():
        RULES[key](value, f"TASKLOOP[{key!r}]")
        shown, as_time = reference.default_parts(key)
        assert shown == repr(value), key
        if as_time is not None:
            count, unit = as_time.split()
            size = {"day": 86400, "hour": 3600, "minute": 60}[unit.rstrip("s")]
            assert int(count) * size == value, (key, as_time)


def test_no_type_or_default_is_written_by_hand_in_the_settings_reference():
    text = reference.PAGE.read_text()
    written = re.findall(r"^:(type|default):", text, re.M)
    assert not written, "docs/settings.md must leave :type: and :default: to conf.py (the build reads them)"


def test_every_python_example_of_the_settings_reference_passes_the_system_checks():
    blocks = BLOCK.findall(reference.PAGE.read_text())
    assert blocks, "docs/settings.md has no example"
    for kind, code in blocks:
        assert kind == "settings", (
            f"a Python block of docs/settings.md without <!-- docs-test: settings -->: {code}"
        )
        namespace: dict[str, object] = {}
        exec(compile(code, "docs/settings.md", "exec"), namespace)
        with override_settings(TASKLOOP=namespace["TASKLOOP"]):
            assert check_settings() == []


def test_the_system_checks_hints_name_the_settings_reference_that_exists():
    assert reference.PAGE.exists()
    with override_settings(TASKLOOP={"MAX_ATTEMPTS": 0, "ZZZ": 1}):
        hints = [message.hint for message in check_settings()]
    assert len(hints) == 2
    assert all("docs/settings.md" in hint for hint in hints), hints


def _text(fragment: str) -> str:
    """The words of an HTML fragment, tags dropped, spaces folded (none before a colon)."""
    return re.sub(r" :", ":", " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split()))


def test_the_docs_build_without_a_warning_and_show_each_setting_s_type_and_default(tmp_path):
    missing = [name for name in ("sphinx", "myst_parser", "furo") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed: install the docs extra "
            "(pip install -e '.[docs]') to build the documentation"
        )
    out = tmp_path / "html"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, f"sphinx-build failed:\n{build.stdout}\n{build.stderr}"
    for page in ("index", "guarantees", "operating", "production", "settings", "api", "architecture"):
        assert (out / f"{page}.html").exists(), page
    settings_page = (out / "settings.html").read_text()
    for key in DEFAULTS:
        start = settings_page.find(f'id="confval-{key}"')
        assert start >= 0, f"the built settings page has no description of {key}"
        said = _text(settings_page[start : settings_page.find("</dl>", start)])
        assert f"Type: {reference.kind_of(key).text}" in said, (key, said)
        assert f"Default: {DEFAULTS[key]!r}" in said, (key, said)
    api_page = _text((out / "api.html").read_text())
    for name in ("TaskLoop", "JobBoard", "Tube", "Lockable", "TaskloopBackend", "run_queued", "report"):
        assert name in api_page, name


#: A Python block of a page, however indented (a list item's), with the marker before it.
ANY_BLOCK = re.compile(r"^( *)(?:<!-- docs-test: (\w+) -->\n\1)?```python\n(.*?)^\1```", re.S | re.M)


@pytest.mark.django_db(transaction=True)
def test_every_python_example_of_the_operating_page_runs(tmp_path):
    """docs/operating.md's examples, each run with what it names made first (a buried task, a
    tube, a board, a loop model, a schedule): fragments that no longer fit the API fail here."""
    import datetime as dt

    from django.db.utils import ConnectionHandler
    from django.utils.module_loading import import_string

    from django_taskloop.models import Failure, JobBoard, Schedule, Tube
    from tests.testapp.models import IntLoop

    blocks = [
        (mark, textwrap.dedent(code))
        for _, mark, code in ANY_BLOCK.findall((DOCS / "operating.md").read_text())
    ]
    assert [mark for mark, _ in blocks] == [
        "failures",
        "pause",
        "schedules",
        "concurrency",
        "limits",
        "set_limit",
        "rates",
        "set_rate",
        "task_limits",
        "key_limits",
        "urls",
        "sqlite",
        "shards",
    ], blocks
    tube = Tube.objects.create_tube("emails", "fifottl")
    task = tube.put({"to": "a@example.com"})
    tube.bury(task.pk)
    try:
        raise ConnectionError("smtp down")
    except ConnectionError as error:
        Failure.objects.record(kind="task", queue="emails", item=task.pk, attempt=1, worker="w", error=error)
    Schedule.objects.create(
        name="daily-digest", kind="task", cron="0 7 * * *", target="m.f", next_run_at=dt.datetime.now(dt.UTC)
    )
    given = {
        "failures": {"task": task},
        "pause": {"tube": tube, "board": JobBoard.objects.create_board("builds"), "FeedLoop": IntLoop},
        "sqlite": {"BASE_DIR": tmp_path},
    }
    ran: dict[str, dict[str, Any]] = {}
    for mark, code in blocks:
        if mark == "urls":
            code = "from django.urls import include, path\n" + code
        namespace: dict[str, Any] = dict(given.get(mark, {}))
        exec(compile(code, f"docs/operating.md ({mark})", "exec"), namespace)
        ran[mark] = namespace
    assert list(Failure.objects.for_item(task)) and not tube.paused
    assert not Schedule.objects.get(name="daily-digest").paused
    # The SQLite settings open a database in WAL mode; the shards' name a backend that imports.
    wal = ConnectionHandler(ran["sqlite"]["DATABASES"])["default"]
    with wal.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
    wal.close()
    import_string(ran["shards"]["TASKS"]["default"]["BACKEND"])
    # The handler that sets its own concurrency is registered with it (and unregistered again).
    from django_taskloop.workers import registry

    assert registry.pop("webhooks").concurrency == 20
    assert ran["concurrency"]["deliver"].concurrency == 20
    # ... and the one with a running limit, with it.
    assert registry.pop("charges").limit == 5
    assert ran["limits"]["charge"].limit == 5
    assert Tube.objects.get(name="reports").running_limit is None
    # ... and the one with a rate, with it; the tube's own rate set and lifted.
    assert str(registry.pop("newsletter").rate) == "100/m"
    assert str(ran["rates"]["send"].rate) == "100/m"
    geocode = Tube.objects.get(name="geocode")
    assert geocode.rate is None and geocode.running_limit == 10
    # ... and the one with a key limit, with it; the tube's own set and lifted.
    assert registry.pop("syncs").key_limit == 3
    assert str(registry.pop("callbacks").key_rate) == "60/m"
    accounts = Tube.objects.get(name="accounts")
    assert accounts.key_limit is None and accounts.key_rate is None
    # The Django Tasks queue's limits, read by the backend they name.
    from django_taskloop.compat import TASKS_AVAILABLE

    if TASKS_AVAILABLE:
        from django_taskloop.backends.backend import TaskloopBackend
        from django_taskloop.validation import Rate

        params = ran["task_limits"]["TASKS"]["default"]
        assert TaskloopBackend("default", params).queue_limits() == {"emails": (5, Rate(100, 60))}
