"""Count what a worker process sends its database (the latency scenario's idle cost): the
suite's counter, ``tests/statement_log.py``, the one place it is written. ``ENV``
(``TASKLOOP_STATEMENT_LOG``) names the file the notes go to at exit."""

import sys
from pathlib import Path

# The checkout's root, where ``tests`` lives (the bench runs from a checkout).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.statement_log import ENV, install, read  # noqa: E402

__all__ = ["ENV", "install", "read"]
