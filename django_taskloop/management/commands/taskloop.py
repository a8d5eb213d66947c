"""``manage.py taskloop``: the operator's terminal (status, failures, retry, pause, resume, prune,
alive)."""

from __future__ import annotations

import argparse
import functools
import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_taskloop.management.terminal import actions, failures, status
from django_taskloop.management.terminal.text import BadInput, parse_duration
from django_taskloop.management.terminal.trouble import (
    checked_databases,
    database_trouble,
    unreachable_database,
)
from django_taskloop.queues import PRUNABLE, QueueError, prune, resolve

#: Seconds between two refreshes of ``status --watch`` when none is given.
WATCH_EVERY = 2.0


def _one_line_error(parser: CommandParser, message: str) -> Any:
    """A usage error as one line on stderr (and exit status 2), not the usage then the error."""
    if parser.called_from_command_line:
        parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")
    raise CommandError(f"Error: {message}", returncode=2)


class OneLineParser(CommandParser):
    """A subcommand's parser whose usage errors are one line (and exit status 2)."""

    def error(self, message: str) -> Any:
        return _one_line_error(self, message)


def _django_options(p: CommandParser, *, but: tuple[str, ...] = ()) -> None:
    """Django's options of every command (``--settings``, ``--traceback``, …), accepted after the
    action too, where Django users put them (``taskloop status --settings mysite.prod``). Django
    reads ``--settings`` and ``--pythonpath`` from anywhere in the command line before it sets
    up; here they only need to be allowed. Absent, they leave the values given before the action
    alone. ``but``: options the action has its own meaning for (``failures --traceback``)."""
    unset = argparse.SUPPRESS
    for flag in ("--settings", "--pythonpath"):
        if flag not in but:
            p.add_argument(flag, default=unset, help=argparse.SUPPRESS)
    for flag in ("--traceback", "--no-color", "--force-color", "--skip-checks"):
        if flag not in but:
            p.add_argument(flag, action="store_true", default=unset, help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbosity", type=int, choices=[0, 1, 2, 3], default=unset, help=argparse.SUPPRESS)


def _status_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="Every queue: counts by state, oldest ready wait, failures, workers.")
    p.add_argument("queues", nargs="*", metavar="QUEUE", help="Only these queues (name or kind:name).")
    p.add_argument(
        "--json", action="store_true", help="One JSON document (with --watch: one line each time)."
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help=f"Count every row (default: each state up to {status.COUNT_CAP:,}, shown as {status.COUNT_CAP}+).",
    )
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=WATCH_EVERY,
        metavar="SECONDS",
        help=f"Refresh every SECONDS (default {WATCH_EVERY:g}) until Ctrl-C.",
    )


def _failures_parser(sub: Any) -> None:
    p = sub.add_parser("failures", help="The latest failures with their error, newest first.")
    p.add_argument("--queue", metavar="QUEUE", help="Only this queue's (name or kind:name).")
    p.add_argument("--since", metavar="DURATION", help="Only those of the last DURATION (90s, 5m, 2h, 7d).")
    p.add_argument("--limit", type=int, default=20, metavar="N", help="At most N (default 20).")
    p.add_argument("--traceback", action="store_true", dest="tracebacks", help="Show each one's traceback.")
    p.add_argument("--json", action="store_true", help="One JSON document, tracebacks included.")


def _change_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "retry",
        help="Kick buried tube tasks, re-post trashed jobs, bump loop ids, retry FAILED Django Tasks.",
    )
    p.add_argument("queue", metavar="QUEUE", help="The queue: its name, or kind:name.")
    p.add_argument("ids", nargs="*", metavar="ID", help="Task ids, job uuids, loop ids or result ids.")
    p.add_argument("--all", action="store_true", dest="every", help="Every failed item of QUEUE.")
    for verb, says in (("pause", "Workers leave these queues alone"), ("resume", "Workers serve them again")):
        q = sub.add_parser(verb, help=f"{says}.")
        q.add_argument("queues", nargs="+", metavar="QUEUE")
    p = sub.add_parser(
        "prune", help="Delete old failures, finished Django Task results, consumed jobs' history."
    )
    p.add_argument(
        "--older-than", required=True, metavar="DURATION", help="Only rows older than this (90s, 5m, 2h, 7d)."
    )
    p.add_argument(
        "--only",
        action="append",
        choices=sorted(PRUNABLE),
        help="Only this kind of row (repeatable).",
    )
    p.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")
    p = sub.add_parser(
        "alive", help="Exit 0 if a worker process on this host beat lately, else 1 (a health check)."
    )
    p.add_argument("--host", default=socket.gethostname(), help="Another host's (default: this one).")


class Command(BaseCommand):
    help = "See and steer the queues: status, failures, retry, pause, resume, prune; alive: a health check."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # What the actions' parsers leave (an unknown option after the action) ends up here:
        # one line too.
        parser.error = functools.partial(_one_line_error, parser)  # type: ignore[method-assign]
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(
            dest="action", metavar="ACTION", required=True, parser_class=OneLineParser
        )
        _status_parser(sub)
        _failures_parser(sub)
        _change_parsers(sub)
        for name, action in sub.choices.items():
            _django_options(action, but=("--traceback",) if name == "failures" else ())

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's system checks, once the queues' databases answer: Django 6 runs the model
        checks against them (MySQL's read its server's version), so a database that is down
        would be a traceback there instead of the one line :func:`database_trouble` says."""
        down = unreachable_database()
        if down is not None:
            raise CommandError(down, returncode=1)
        kwargs["databases"] = checked_databases(kwargs.get("databases"))
        super().check(*args, **kwargs)

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        try:
            getattr(self, f"do_{action}")(**options)
        except (BadInput, QueueError) as error:
            raise CommandError(str(error), returncode=2) from None
        except DatabaseError as error:
            said, code = database_trouble(error)
            raise CommandError(said, returncode=code) from None

    def say(self, lines: list[str] | str) -> None:
        for line in [lines] if isinstance(lines, str) else lines:
            self.stdout.write(line)

    def do_status(
        self, *, queues: list[str], json: bool, exact: bool, watch: float | None, **options: Any
    ) -> None:
        wanted = [resolve(name) for name in queues]
        if watch is None:
            self.say(status.render(wanted, json, exact=exact))
            return
        if not watch > 0:
            raise BadInput(f"--watch takes a positive number of seconds, not {watch:g}")
        tty = self.stdout.isatty() and not json
        status.watch(
            watch, lambda: status.render(wanted, json, exact=exact, indent=None), self.stdout, tty=tty
        )

    def do_failures(
        self,
        *,
        queue: str | None,
        since: str | None,
        limit: int,
        tracebacks: bool,
        json: bool,
        **options: Any,
    ) -> None:
        if limit < 1:
            raise BadInput(f"--limit takes a positive number, not {limit}")
        where = resolve(queue) if queue is not None else None
        seconds = parse_duration(since, "--since") if since is not None else None
        found = list(failures.failures(where, seconds, limit))
        self.say(
            failures.failures_json(found) if json else failures.failures_lines(found, tracebacks=tracebacks)
        )

    def do_retry(self, *, queue: str, ids: list[str], every: bool, **options: Any) -> None:
        if bool(ids) == every:
            raise BadInput(
                f"retry {queue} needs the ids to retry, or --all for every failed item (not both)"
                if every
                else f"retry {queue}: name the ids to retry, or say --all for every failed item"
            )
        found = resolve(queue)
        self.say(found.retry_all() if every else found.retry(ids))

    def do_pause(self, *, queues: list[str], **options: Any) -> None:
        for queue in [resolve(name) for name in queues]:
            self.say(f"paused {queue.label}" if queue.pause() else f"{queue.label} was paused already")

    def do_resume(self, *, queues: list[str], **options: Any) -> None:
        for queue in [resolve(name) for name in queues]:
            self.say(f"resumed {queue.label}" if queue.resume() else f"{queue.label} was not paused")

    def do_alive(self, *, host: str, **options: Any) -> None:
        ok, line = actions.alive(host)
        if not ok:
            raise CommandError(line, returncode=1)
        self.say(line)

    def do_prune(self, *, older_than: str, only: list[str] | None, dry_run: bool, **options: Any) -> None:
        seconds = parse_duration(older_than, "--older-than")
        self.say(prune(seconds, list(dict.fromkeys(only or PRUNABLE)), dry_run))
