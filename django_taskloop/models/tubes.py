"""Placeholder: filled in by the tubes facade."""

__all__: list[str] = []
