"""Test-only models, one module per facade."""

from .lockable import *  # noqa: F403
from .lockable import __all__ as _lockable
from .loops import *  # noqa: F403
from .loops import __all__ as _loops
from .workers import *  # noqa: F403
from .workers import __all__ as _workers

__all__ = [*_lockable, *_loops, *_workers]
