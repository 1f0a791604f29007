"""The receive gate: a failing queue's backoff and its log lines, and pending long polls."""

from __future__ import annotations

import logging

import pytest

from celery_sqs_heartbeat.receiving.gate import ReceiveGate
from celery_sqs_heartbeat.receiving.retries import ReceiveBackoff, ReceiveFailure
from tests.unit.conftest import FakeClock

GATE_LOGGER = "celery_sqs_heartbeat.receiving.gate"
THROTTLED = ReceiveFailure("ThrottlingException", "slow down", fatal=False)


@pytest.fixture
def gate(clock: FakeClock) -> ReceiveGate:
    return ReceiveGate(clock, ReceiveBackoff(base=1.0, cap=4.0, jitter=lambda: 1.0))


def messages(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == GATE_LOGGER]


def test_a_failing_queue_waits_longer_each_time_and_logs_its_streak_twice(
    gate: ReceiveGate, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=GATE_LOGGER)
    assert gate.wait("jobs") == 0

    gate.failed("jobs", THROTTLED)
    assert gate.wait("jobs") == 1.0
    clock.advance(1.0)
    gate.failed("jobs", THROTTLED)
    assert gate.wait("jobs") == 2.0
    assert gate.wait("other") == 0
    clock.advance(2.0)
    gate.succeeded("jobs")

    assert gate.wait("jobs") == 0
    (warning, recovered) = messages(caplog)
    assert warning[0] == logging.WARNING and "jobs failed" in warning[1]
    assert recovered == (
        logging.INFO,
        "Receiving from SQS queue jobs works again, after 2 failed attempt(s) in 3.0 s",
    )


def test_a_release_at_shutdown_waits_for_the_channel_s_pending_long_poll(
    gate: ReceiveGate, clock: FakeClock
) -> None:
    gate.poll_sent("https://sqs/jobs")
    clock.advance(7.5)

    assert gate.release_delay("https://sqs/jobs", wait_time_seconds=10) == 3
    assert gate.release_delay("https://sqs/other", wait_time_seconds=10) == 0
    gate.poll_answered("https://sqs/jobs")
    assert gate.release_delay("https://sqs/jobs", wait_time_seconds=10) == 0


def test_a_poll_older_than_its_wait_time_holds_nothing_back(
    gate: ReceiveGate, clock: FakeClock
) -> None:
    gate.poll_sent("https://sqs/jobs")
    clock.advance(30)

    assert gate.release_delay("https://sqs/jobs", wait_time_seconds=10) == 0
