"""Placeholder: filled in by the loops facade."""

__all__: list[str] = []
