"""Placeholder: filled in by the workers/Tasks-backend developer."""

__all__: list[str] = []
