"""The throwaway servers and test hosts work as the other reliability tests assume."""

from __future__ import annotations

import pytest

from .conftest import BRIDGE_ADDRESS, DB_NAME, run_remote

pytestmark = pytest.mark.slow


def test_throwaway_server_survives_stop_and_start(throwaway):
    throwaway.execute("CREATE TABLE probe (n INTEGER)")
    throwaway.execute("INSERT INTO probe VALUES (7)")
    throwaway.stop(crash=True)
    assert not throwaway.reachable()
    throwaway.start()
    assert throwaway.execute("SELECT n FROM probe") == [(7,)]


def test_hosts_reach_the_database_over_their_link_only(throwaway, netns_hosts):
    host = netns_hosts[0]
    url = throwaway.url(host=BRIDGE_ADDRESS)
    assert run_remote(url, "tests.reliability.remote:ping", netns=host.netns) == DB_NAME
    host.cut()
    try:
        with pytest.raises(AssertionError):
            run_remote(url, "tests.reliability.remote:ping", netns=host.netns, timeout=60)
    finally:
        host.restore()
    assert run_remote(url, "tests.reliability.remote:ping", netns=host.netns) == DB_NAME
