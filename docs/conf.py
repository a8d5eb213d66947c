"""Sphinx configuration of django-taskloop's documentation.

Build it with ``sphinx-build -W --keep-going -b html docs build/docs``: the ``docs`` extra
installs what it needs (on Django 5.2 with the ``tasks`` extra, whose backport the Tasks backend
documented here needs). The pages are Markdown (MyST); the API reference is read from the
public docstrings, which needs Django set up: the test suite's settings are used, and no
database is opened. The ``TASKLOOP`` settings reference is typed and defaulted from
``django_taskloop/conf.py`` by the extension in ``_ext/``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent

# The package, the test settings (tests.settings) and the demo project they build on.
sys.path[:0] = [str(ROOT), str(ROOT / "testproject"), str(DOCS / "_ext")]
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
# The build reads no database: the demo project's SQLite default (which needs no driver), whatever
# DATABASE_URL the shell that runs the build exports for the test suite.
os.environ["DATABASE_URL"] = ""

import django  # noqa: E402

django.setup()

import django_taskloop  # noqa: E402

project = "django-taskloop"
author = "django-taskloop's authors"
copyright = "django-taskloop's authors"
version = release = django_taskloop.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "taskloop_settings",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

# Headings get anchors (``operating.md#the-terminal``) down to level 3.
myst_heading_anchors = 3

# No intersphinx: the build fetches nothing, and works offline.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}
autodoc_inherit_docstrings = False

html_theme = "furo"
html_title = f"django-taskloop {release}"
