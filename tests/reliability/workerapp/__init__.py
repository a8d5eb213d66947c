"""Handlers of the reliability tests, with short leases so that lost work comes back fast.

Installed only in worker subprocesses (``tests.reliability.worker_settings``). The app has no
models: the handlers log what they run in the worker tests' ``WorkLog``.
"""
