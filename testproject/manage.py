#!/usr/bin/env python
"""The demo project's manage.py."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    # Run from a checkout without installing: the repo root holds django_taskloop.
    sys.path[:0] = [str(here), str(here.parent)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
