#!/usr/bin/env python
"""Our benchmark project: ``python bench/project/manage.py workers --burst --processes 4``."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    # The checkout's django_taskloop first, whatever is installed.
    sys.path[:0] = [str(here), str(here.parent.parent)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
