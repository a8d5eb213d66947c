"""What a Galera cluster needs of the engine, on the suite's own database: a node that is not
ready (error 1047) drops the connection, and the rows every worker updates (tube counter slots,
throughput minutes) are picked per node, so that two nodes never write the same row.

A Galera node's share is its ``auto_increment_offset`` among ``auto_increment_increment``
(set per node by ``wsrep_auto_increment_control``); here a session sets them as three nodes
would. The cluster itself is exercised in tests/reliability/test_galera.py.
"""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection

from django_taskloop import engine
from django_taskloop.models import Tube
from django_taskloop.models.operating import Throughput, record_throughput
from django_taskloop.models.tubes import SLOTS, TubeStat, _slot
from django_taskloop.stats import processed_last_hour

pytestmark = pytest.mark.django_db(transaction=True)


def as_node(offset: int, nodes: int = 3) -> None:
    """Make the default connection a fresh one to Galera node ``offset`` of ``nodes``."""
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute(f"SET SESSION auto_increment_increment = {nodes}, auto_increment_offset = {offset}")


def test_a_node_that_is_not_ready_drops_the_connection(vendor):
    not_ready = OperationalError(1047, "WSREP has not yet prepared node for application use")
    connection.ensure_connection()
    assert connection.is_usable()  # it answers a ping: Django alone would keep it
    connection.errors_occurred = True
    engine.discard_if_broken("default", not_ready)
    if vendor == "mysql":
        assert engine.is_connection_lost(not_ready, "default")
        assert connection.connection is None
    else:  # (1047 means nothing there)
        assert connection.connection is not None
    Tube.objects.create_tube("after", "fifo").put(1)  # the next call connects again


def test_counter_slots_of_different_nodes_never_meet(vendor):
    if vendor != "mysql":
        assert engine.node_share("default") == (0, 1)
        assert 0 <= _slot() < SLOTS
        return
    slots = {}
    for offset in (1, 2, 3):
        as_node(offset)
        assert engine.node_share("default") == (offset - 1, 3)
        slots[offset] = _slot()
    connection.close()
    # Node n's processes use only slots n-1, n-1+3, ...: no slot of two nodes.
    assert {offset: slot % 3 for offset, slot in slots.items()} == {1: 0, 2: 1, 3: 2}
    # A lone server (increment 1) spreads over every slot.
    as_node(1, nodes=1)
    assert engine.node_share("default") == (0, 1)
    connection.close()


@pytest.mark.vendors("mysql")  # node shares exist on MySQL/MariaDB (Galera) only
def test_a_tube_counts_in_its_nodes_slots(vendor):
    tube = Tube.objects.create_tube("counted", "fifo")
    for offset in (1, 2, 3):
        tube.put(offset)
        as_node(offset)
        assert tube.take(0) is not None
    connection.close()
    assert tube.statistics()["calls"]["take"] == 3
    used = TubeStat.objects.filter(tube=tube, take__gt=0).values_list("slot", flat=True)
    assert sorted(slot % 3 for slot in used) == [0, 1, 2]


def test_throughput_minutes_have_a_row_per_node(vendor):
    nodes = (1, 2) if vendor == "mysql" else (1,)
    for offset in nodes:
        if vendor == "mysql":
            as_node(offset)
        record_throughput("task", "q", done=5, failed=1)
        record_throughput("task", "q", done=2)
    connection.close()
    rows = sorted(Throughput.objects.values_list("node", "done", "failed"))
    assert rows == [(offset - 1, 7, 1) for offset in nodes]
    assert processed_last_hour() == {("task", "q"): (7 * len(nodes), len(nodes))}
