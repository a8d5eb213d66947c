"""No claim or settle statement is JIT-compiled on a PostgreSQL at its stock settings (issue 39).

The transactions that claim and settle queue rows pin their plans (``Features.pin_plans``:
no sequential scan, bitmap scan or sort). PostgreSQL prices a plan that needs a disabled
node at about 1e10, so a keyed claim (``utube``/``utubettl``, keyed Django Tasks), whose best
plan still has one, is priced far above ``jit_above_cost`` (100,000 by default). At the
default ``jit = on`` every such claim was then compiled by LLVM: 0.3–0.7 s a claim on a 2-core
machine, a keyed drain at 4–9 tasks/s. The statements of a worker's batches are run here,
pinned as the engine pins them, under ``EXPLAIN (ANALYZE)``; a ``JIT:`` section in the plan
means PostgreSQL compiled it. A plan check, not a timing assert.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_taskloop.engine import vendor
from django_taskloop.models import Tube
from django_taskloop.models.tubes import ClaimCursor

pytestmark = [
    pytest.mark.vendors("postgresql"),  # its JIT compiler
    pytest.mark.django_db(transaction=True),
]


def _jit_available() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_jit_available(), current_setting('jit')")
        available, setting = cursor.fetchone()
    return bool(available) and setting == "on"


def sent(call: Callable[[], Any]) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        call()
    return [q["sql"] for q in queries.captured_queries]


def explained(statements: list[str]) -> list[tuple[str, str]]:
    """Each queue-row statement of ``statements`` with its ``EXPLAIN (ANALYZE)`` in a
    transaction that is rolled back, pinned as the engine pins its own transactions."""
    plans = []
    lead = f"{vendor.PIN_POSTGRESQL_PLANS}; "
    for sql in statements:
        if sql.startswith(lead):  # (the pin leads the text of the statement it pins)
            sql = sql[len(lead) :]
        if "taskloop_task" not in sql or not sql.lstrip().upper().startswith(
            ("WITH", "SELECT", "UPDATE", "DELETE")
        ):
            continue
        if "set_config(" in sql:
            continue
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            try:
                cursor.execute(vendor.PIN_POSTGRESQL_PLANS)
                cursor.execute(f"EXPLAIN (ANALYZE, COSTS) {sql}")
                plans.append((sql, "\n".join(row[0] for row in cursor.fetchall())))
            finally:
                cursor.execute("ROLLBACK")
    return plans


def test_the_servers_jit_is_at_its_default():
    """The suite's PostgreSQL runs as users run it: JIT available and on (else the test below
    could not fail)."""
    assert _jit_available(), "the test server's jit is off or unavailable: run it at its stock settings"


@pytest.mark.parametrize("kind", ["utube", "utubettl", "fifo", "fifottl"])
def test_no_claim_or_settle_statement_is_jit_compiled(kind):
    options = {"ttr": 60} if kind.endswith("ttl") else {}
    tube = Tube.objects.create_tube(f"jit-{kind}", kind, **options)
    keyed = kind.startswith("utube")
    for n in range(400):
        tube.put(n, **({"utube": f"k{n % 40}"} if keyed else {}))
    at = ClaimCursor()
    statements: list[str] = []
    taken: list[Any] = []

    def take() -> None:
        taken[:] = tube.take_many(20, consumer="w", cursor=at)

    def ack_and_take() -> None:
        _, more = tube.ack_and_take([task.id for task in taken], 20, consumer="w", cursor=at)
        taken[:] = more

    statements += sent(take)
    assert taken
    statements += sent(ack_and_take)
    statements += sent(lambda: tube.release_many([task.id for task in taken[:5]], consumer="w"))
    if kind.endswith("ttl"):
        statements += sent(lambda: tube.touch_many([task.id for task in taken[5:10]], 30, consumer="w"))
    statements += sent(lambda: tube.ack_many([task.id for task in taken[5:]], consumer="w"))
    plans = explained(statements)
    assert any("SKIP LOCKED" in sql for sql, _ in plans), statements
    compiled = [(sql, text) for sql, text in plans if "JIT:" in text]
    assert not compiled, "JIT-compiled:\n\n" + "\n\n".join(f"{sql}\n{text}" for sql, text in compiled)
