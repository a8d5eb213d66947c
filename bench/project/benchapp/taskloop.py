"""The benchmark's handler: a no-op tube task that records that it ran."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django_taskloop.workers import tube

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import record  # noqa: E402


@tube("bench", batch=100)
def noop(task: Any) -> None:
    """Run nothing; the record is the whole job."""
    record(task.data)
