"""Models of django-taskloop: the abstract ``TaskLoop`` and ``Lockable``, and the concrete
``JobBoard``/``Job`` and ``Tube``/``Task``."""

from .lockable import Lockable, LockableManager, LockableQuerySet

__all__ = ["Lockable", "LockableManager", "LockableQuerySet"]
