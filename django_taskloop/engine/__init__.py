"""The claim/lease engine under every facade (loops, job boards, tubes, Lockable).

One primitive: a row with a lease (an owner and a deadline on the database's clock), claimed
under ``SELECT … FOR UPDATE SKIP LOCKED`` (SQLite: under a write lock taken first). The
facades hold only their domain's policy: which rows are claimable, in which order, and what a
claim writes. The engine owns every statement and every difference between databases.

Its modules, by job:

- :mod:`.vendor`: the dialect — :class:`Features`, the database clock (:class:`DbNow`,
  :class:`Shifted`; tests move it with :func:`set_clock_offset`), indexes, retryable errors,
  SQLite's writer turns, notifications;
- :mod:`.transactions`: write transactions and their retries;
- :mod:`.insert`: a put's one ``INSERT``, rows together, rows by key;
- :mod:`.claim`: claims, acknowledge-and-claim, rows locked for a change of one's own;
- :mod:`.kept`: statements compiled once and kept (a worker's hot path);
- :mod:`.cursor`: a consumer's claim cursor (claims that start after its last);
- :mod:`.compiler`: every use of Django's private query and compiler machinery.
"""

from __future__ import annotations

from .claim import (
    MAX_LIMIT,
    Claimed,
    ClaimSpec,
    ack_and_claim,
    claim,
    count_rows,
    delete_and_claim,
    lock_free,
    lock_rows,
    update_returning,
)
from .compiler import by_keys, unsaved
from .cursor import ClaimCursor, Resume
from .deadline import DeadlinePassed, bounded
from .insert import MissingRows, insert, insert_together
from .kept import KEPT_STATEMENTS, add_to, delete_pks, delete_rows
from .transactions import discard_if_broken, poll, run_in_transaction, write_transaction
from .vendor import (
    SUPPORTED,
    DbNow,
    Features,
    NullsFirstIndex,
    PartialIndex,
    Shifted,
    batched,
    clock_offset,
    clock_shift,
    data_files,
    db_now,
    estimated_row_count,
    features,
    is_connection_lost,
    is_retryable,
    listen,
    listen_connection,
    listen_params,
    local_clock,
    node_share,
    notifying,
    on_clock_change,
    send_notify,
    set_clock_offset,
    supported,
    take_write_lock,
    to_datetime,
    writers_in_turn,
)

__all__ = [
    "bounded",
    "DeadlinePassed",
    "by_keys",
    "unsaved",
    "DbNow",
    "Shifted",
    "PartialIndex",
    "NullsFirstIndex",
    "db_now",
    "clock_offset",
    "local_clock",
    "clock_shift",
    "set_clock_offset",
    "on_clock_change",
    "data_files",
    "to_datetime",
    "features",
    "Features",
    "supported",
    "SUPPORTED",
    "write_transaction",
    "run_in_transaction",
    "poll",
    "insert",
    "insert_together",
    "MissingRows",
    "claim",
    "Claimed",
    "ClaimSpec",
    "ClaimCursor",
    "Resume",
    "ack_and_claim",
    "lock_free",
    "lock_rows",
    "count_rows",
    "MAX_LIMIT",
    "delete_pks",
    "delete_rows",
    "delete_and_claim",
    "add_to",
    "batched",
    "discard_if_broken",
    "estimated_row_count",
    "send_notify",
    "listen_params",
    "listen_connection",
    "listen",
    "KEPT_STATEMENTS",
    "is_connection_lost",
    "is_retryable",
    "node_share",
    "notifying",
    "take_write_lock",
    "update_returning",
    "writers_in_turn",
]
