"""The operator's terminal: what ``manage.py taskloop`` shows and does.

``status`` and ``failures`` read the read model (:mod:`django_taskloop.stats`) as the admin
does; ``retry``, ``pause``, ``resume`` and ``prune`` go through the facades' public verbs. The
command only parses its arguments and writes what these return.
"""
