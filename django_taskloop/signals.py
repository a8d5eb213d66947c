"""Signals sent by django-taskloop, always after the transaction that caused them commits."""

from django.dispatch import Signal

__all__ = ["job_posted", "job_removed"]

#: Sent with ``job=`` after a job is posted (or re-posted) and committed.
job_posted = Signal()
#: Sent with ``job=`` after a job is consumed or trashed and committed.
job_removed = Signal()
