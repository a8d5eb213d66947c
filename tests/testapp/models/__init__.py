"""Test-only models, one module per facade."""

from .lockable import Ticket

__all__ = ["Ticket"]
