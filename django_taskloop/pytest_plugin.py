"""pytest fixtures for code that enqueues Django Tasks (see :mod:`django_taskloop.testing`).

Opt in, in your ``conftest.py``::

    pytest_plugins = ["django_taskloop.pytest_plugin"]

It is not registered through an entry point on purpose: installing django-taskloop does not
add fixtures to every pytest run on the machine. The fixtures need pytest-django.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .testing import Clock

__all__ = ["taskloop_run_queued", "taskloop_immediate", "taskloop_clock"]


@pytest.fixture
def taskloop_run_queued(db: Any) -> Callable[..., int]:
    """:func:`django_taskloop.testing.run_queued`, with database access (pytest-django's ``db``,
    or ``transactional_db`` if the test asks for it)."""
    from .testing import run_queued

    return run_queued


@pytest.fixture
def taskloop_immediate(db: Any) -> Iterator[None]:
    """Run every ``TaskloopBackend`` of ``TASKS`` as an
    :class:`~django_taskloop.testing.ImmediateBackend` for the test: tasks run as they are
    enqueued."""
    from .testing import immediate

    with immediate():
        yield


@pytest.fixture
def taskloop_clock() -> Iterator[Clock]:
    """A :class:`~django_taskloop.testing.Clock`: ``taskloop_clock.advance(seconds)`` moves this
    process's view of the database's clock forward, so that delays, ttls, claims and backoffs
    end without sleeping (worker subprocesses do not see it: see
    :func:`~django_taskloop.testing.advance_clock`). Back on the real clock at teardown."""
    from .testing import controlled_clock

    with controlled_clock() as clock:
        yield clock
