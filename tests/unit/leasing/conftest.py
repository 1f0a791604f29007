"""What the lease manager's parts share, built by hand so each part can be tested alone."""

from __future__ import annotations

import logging
import threading

import pytest

from celery_sqs_heartbeat.leasing.book import LeaseBook
from celery_sqs_heartbeat.leasing.manager_state import ManagerState
from celery_sqs_heartbeat.leasing.outbox import Outbox
from celery_sqs_heartbeat.leasing.reporting import LeaseReporter
from celery_sqs_heartbeat.monitoring.metrics import LeaseMetrics
from tests.unit.conftest import FakeClock

PARTS_LOGGER = logging.getLogger("tests.leasing.parts")


@pytest.fixture
def state(clock: FakeClock) -> ManagerState:
    """A manager's shared state on the fake clock, its counters its own."""
    lock = threading.Lock()
    return ManagerState(
        book=LeaseBook(),
        outbox=Outbox(retry_delay=1.0),
        report=LeaseReporter(LeaseMetrics(), clock, PARTS_LOGGER),
        clock=clock,
        lock=lock,
        changed=threading.Condition(lock),
    )
