"""The suite's test clock: ``clock.advance(seconds)`` instead of sleeping for a database timer.

Every deadline of the package (a delay, ttl, ttr, claim or lock expiry, an age) is written and
compared by the database's clock. Where the code under test runs in the test's own process,
the ``clock`` fixture moves this process's view of that clock forward
(:func:`django_taskloop.testing.advance_clock`) and puts it back at teardown. A worker started
as another process does not see it: tests that race real processes still sleep.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django_taskloop.testing import Clock


@pytest.fixture
def clock() -> Iterator[Clock]:
    """A :class:`~django_taskloop.testing.Clock`, back on the real clock at teardown."""
    # Here, not at the top: pytest imports this module before Django is set up, and the
    # testing helpers import the models.
    from django_taskloop.testing import controlled_clock

    with controlled_clock() as moved:
        yield moved
