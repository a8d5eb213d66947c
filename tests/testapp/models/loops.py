"""Test-only loop models."""

__all__: list[str] = []
