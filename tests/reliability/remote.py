"""Run one function in a fresh Django process: ``python -m tests.reliability.remote mod:func '[args]'``.

The reliability tests keep their own process on the suite's database and do their work on
throwaway servers (and inside network namespaces) through this entry point. The function's
return value is printed as JSON on the last line.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def create_schema() -> list[str]:
    """Create the tables of every installed model (no migrations: they are the lead's)."""
    from django.apps import apps
    from django.db import connection

    made = []
    with connection.schema_editor() as editor:
        for model in apps.get_models(include_auto_created=False):
            if model._meta.managed and not model._meta.proxy:
                editor.create_model(model)
                made.append(model._meta.db_table)
    return made


def ping() -> str:
    """Return the name of the database this process works on (proves it can reach it)."""
    from django.db import connection

    connection.ensure_connection()
    return connection.settings_dict["NAME"]


def main(argv: list[str]) -> None:
    import django

    django.setup()
    module, _, name = argv[1].partition(":")
    args: list[Any] = json.loads(argv[2]) if len(argv) > 2 else []
    result = getattr(importlib.import_module(module), name)(*args)
    sys.stdout.write("\n" + json.dumps(result, default=str) + "\n")


if __name__ == "__main__":
    main(sys.argv)
