"""Placeholder: filled in by the boards facade."""

__all__: list[str] = []
