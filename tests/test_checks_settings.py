"""System checks of the ``TASKLOOP`` setting (taskloop.E020/E021/W020) and of the admin's
``rangefilter`` (taskloop.E030), called directly and met by ``manage.py`` as a subprocess."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from django.test import override_settings

from django_taskloop.checks import check_rangefilter, check_settings
from django_taskloop.conf import DEFAULTS, setting
from tests.workers_util import child_env, manage

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({"MAX_ATTEMPTS": 0}, "TASKLOOP['MAX_ATTEMPTS'] must be >= 1, not 0."),
        ({"MAX_ATTEMPTS": 2.5}, "TASKLOOP['MAX_ATTEMPTS'] must be an int, not float."),
        (
            {"RETRY_BACKOFF": "fast"},
            "TASKLOOP['RETRY_BACKOFF'] must be an int or float number of seconds, not str.",
        ),
        ({"POLL_MAX": 0}, "TASKLOOP['POLL_MAX'] must be > 0, not 0."),
        ({"POLL_FACTOR": 0.5}, "TASKLOOP['POLL_FACTOR'] must be >= 1, not 0.5."),
        ({"RETRIES": -1}, "TASKLOOP['RETRIES'] must be >= 0, not -1."),
        (
            {"GRACE_PERIOD": True},
            "TASKLOOP['GRACE_PERIOD'] must be an int or float number of seconds, not bool.",
        ),
        ({"METRICS_TOKEN": ""}, "TASKLOOP['METRICS_TOKEN'] must be a non-empty str or None, not ''."),
        ({"SCHEDULE": []}, "TASKLOOP['SCHEDULE'] must be a dict, not list."),
        ({"TIME_ZONE": 1}, "TASKLOOP['TIME_ZONE'] must be an IANA time zone name (a str) or None, not int."),
    ],
)
def test_a_bad_value_is_an_error_naming_the_key(value, said):
    with override_settings(TASKLOOP=value):
        found = check_settings()
    assert [(m.id, m.msg) for m in found] == [("taskloop.E020", said)]
    [key] = value
    assert found[0].hint == f"The default is {DEFAULTS[key]!r}; see docs/settings.md, the settings reference."


def test_good_values_and_the_defaults_pass():
    assert check_settings() == []
    good = {"MAX_ATTEMPTS": 1, "RETRY_BACKOFF": 0, "POLL_FACTOR": 1, "METRICS_TOKEN": "t", "TIME_ZONE": "UTC"}
    with override_settings(TASKLOOP=good):
        assert check_settings() == []


def test_an_unknown_key_warns_with_the_nearest_name_and_is_ignored():
    with override_settings(TASKLOOP={"MAX_ATTEMPT": 3, "ZZZ": 1}):
        found = check_settings()
        assert setting("MAX_ATTEMPTS") == 5  # no traceback: the misspelt key is left out
    assert [(m.id, m.hint) for m in found] == [
        ("taskloop.W020", "Did you mean 'MAX_ATTEMPTS'?"),
        (
            "taskloop.W020",
            f"Known keys: {', '.join(DEFAULTS)}; see docs/settings.md, the settings reference.",
        ),
    ]
    assert found[0].msg == "TASKLOOP['MAX_ATTEMPT'] is not a django-taskloop setting: it is ignored."


def test_taskloop_that_is_not_a_dict_is_an_error():
    with override_settings(TASKLOOP=[("MAX_ATTEMPTS", 3)]):
        found = check_settings()
        assert [m.id for m in found] == ["taskloop.E021"]
        assert found[0].hint.endswith("; see docs/settings.md, the settings reference.")
        assert setting("MAX_ATTEMPTS") == 5


def test_admin_without_rangefilter_is_an_error():
    assert check_rangefilter() == []
    with override_settings(INSTALLED_APPS=["django.contrib.admin", "django_taskloop"]):
        found = check_rangefilter()
    assert [m.id for m in found] == ["taskloop.E030"]
    assert "django-admin-rangefilter" in found[0].msg and '"rangefilter"' in found[0].hint


def _manage(tmp_path: Path, extra: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m django *args`` with the test settings plus ``extra`` lines."""
    (tmp_path / "bad_settings.py").write_text(f"from tests.settings import *  # noqa\n{extra}\n")
    env = child_env(DJANGO_SETTINGS_MODULE="bad_settings")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    return manage(*args, env=env)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_workers_refuse_to_start_on_a_bad_setting(tmp_path):
    run = _manage(tmp_path, 'TASKLOOP = {"RETRY_BACKOFF": "fast"}', "workers", "--burst")
    assert run.returncode == 1, run.stderr
    assert "taskloop.E020" in run.stderr and "TASKLOOP['RETRY_BACKOFF']" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "starting" not in run.stderr, run.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the worker's tube is committed: flushed afterwards
def test_check_warns_of_an_unknown_key_and_workers_still_start(tmp_path):
    run = _manage(tmp_path, 'TASKLOOP = {"MAX_ATTEMPT": 3}', "check")
    assert run.returncode == 0, run.stderr
    assert "taskloop.W020" in run.stderr and "Did you mean 'MAX_ATTEMPTS'?" in run.stderr, run.stderr
    run = _manage(tmp_path, 'TASKLOOP = {"MAX_ATTEMPT": 3}', "workers", "--burst", "--only", "demo-emails")
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and "summary demo-emails" in run.stderr, run.stderr


@pytest.mark.slow
def test_check_refuses_an_admin_without_rangefilter(tmp_path):
    extra = 'INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "rangefilter"]'
    run = _manage(tmp_path, extra, "check")
    assert run.returncode == 1, run.stderr
    assert "taskloop.E030" in run.stderr and "INSTALLED_APPS" in run.stderr, run.stderr
