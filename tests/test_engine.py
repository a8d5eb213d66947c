"""The engine's clock and transaction helpers on each database."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_taskloop.engine import DbNow, db_now, features
from tests.testapp.models import Ticket

pytestmark = pytest.mark.django_db


def test_db_now_is_aware_and_close_to_wall_clock():
    now = db_now()
    assert timezone.is_aware(now)
    assert abs((now - timezone.now()).total_seconds()) < 5


def test_dbnow_offsets_are_fractional_seconds():
    Ticket.objects.create()
    Ticket.objects.update(lock_expires_at=DbNow(0.25))
    at = Ticket.objects.get().lock_expires_at
    now = db_now()
    assert dt.timedelta(seconds=0.1) < at - now <= dt.timedelta(seconds=0.26)
    Ticket.objects.update(lock_expires_at=DbNow(-3600.5))
    assert 3599 < (now - Ticket.objects.get().lock_expires_at).total_seconds() < 3602


def test_dbnow_compares_in_filters():
    Ticket.objects.create(lock_expires_at=timezone.now() - dt.timedelta(seconds=10))
    Ticket.objects.create(lock_expires_at=timezone.now() + dt.timedelta(seconds=100))
    assert Ticket.objects.filter(lock_expires_at__lte=DbNow()).count() == 1
    assert Ticket.objects.filter(lock_expires_at__lte=DbNow(200)).count() == 2


def test_features_are_decided_per_vendor(vendor):
    f = features("default")
    assert f.vendor == vendor
    assert f.skip_locked is (vendor != "sqlite")
    assert f.write_lock_first is (vendor == "sqlite")
