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
    gate.succeeded("jobs", clock.now)

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
    token = gate.poll_sent("https://sqs/jobs", 10)
    clock.advance(7.5)

    assert gate.release_delay("https://sqs/jobs") == 3
    assert gate.release_delay("https://sqs/other") == 0
    assert gate.poll_answered(token) == clock.now - 7.5
    assert gate.release_delay("https://sqs/jobs") == 0


def test_a_poll_older_than_its_wait_time_holds_nothing_back(
    gate: ReceiveGate, clock: FakeClock
) -> None:
    gate.poll_sent("https://sqs/jobs", 10)
    clock.advance(30)

    assert gate.release_delay("https://sqs/jobs") == 0


def test_several_polls_of_a_queue_each_count_until_answered(
    gate: ReceiveGate, clock: FakeClock
) -> None:
    """A queue with receives side by side: the release waits for the longest still out,
    and a poll that asked SQS not to wait holds nothing back."""
    long_poll = gate.poll_sent("https://sqs/jobs", 10)
    clock.advance(2)
    short = gate.poll_sent("https://sqs/jobs", 0)
    later_long_poll = gate.poll_sent("https://sqs/jobs", 10)

    assert gate.release_delay("https://sqs/jobs") == 10
    gate.poll_answered(later_long_poll)
    assert gate.release_delay("https://sqs/jobs") == 8
    gate.poll_answered(long_poll)
    assert gate.release_delay("https://sqs/jobs") == 0
    assert gate.poll_answered(short) == clock.now
    assert gate.poll_answered(short) is None
