"""Models of django-taskloop: the abstract ``TaskLoop`` and ``Lockable``, and the concrete
``JobBoard``/``Job`` and ``Tube``/``Task``."""

from .boards import *  # noqa: F403
from .boards import __all__ as _boards
from .lockable import *  # noqa: F403
from .lockable import __all__ as _lockable
from .loops import *  # noqa: F403
from .loops import __all__ as _loops
from .operating import *  # noqa: F403
from .operating import __all__ as _operating
from .results import *  # noqa: F403
from .results import __all__ as _results
from .schedules import *  # noqa: F403
from .schedules import __all__ as _schedules
from .tubes import *  # noqa: F403
from .tubes import __all__ as _tubes

__all__ = [*_lockable, *_loops, *_boards, *_tubes, *_results, *_operating, *_schedules]
