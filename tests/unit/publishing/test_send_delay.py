"""Countdowns sent with DelaySeconds: which publishes get a delay, and how long."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from celery_sqs_heartbeat.publishing.send_delay import SendDelays, send_delay
from tests.unit.conftest import FakeClock

#: A hand-driven "now", in seconds since the epoch.
NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc).timestamp()


def task_message(eta_in: float | None = None, **properties: Any) -> dict[str, Any]:
    """A message as Celery's producer hands it to kombu's ``_put``: protocol 2 headers."""
    app = Celery(broker="memory://", set_as_current=False)
    eta = None
    if eta_in is not None:
        eta = datetime.fromtimestamp(NOW, timezone.utc) + timedelta(seconds=eta_in)
    headers = app.amqp.as_task_v2("42", "tasks.add", eta=eta).headers
    return {
        "body": "W10=",
        "headers": headers,
        "properties": {"delivery_tag": "t-1", **properties},
    }


@pytest.mark.parametrize(
    ("eta_in", "delay"),
    [
        (60, 60),
        # Rounded down: the message arrives at or just before its ETA, and Celery holds
        # it for the fraction left, never after it.
        (299.9, 299),
        (1.0, 1),
        (900, 900),
        # SQS's limit: a farther ETA is delayed 900 s, then parked or held at its receive.
        (900.5, 900),
        (86_400, 900),
    ],
)
def test_an_eta_is_delayed_by_its_whole_seconds_up_to_sqs_limit(eta_in: float, delay: int) -> None:
    assert send_delay("jobs", task_message(eta_in), NOW) == delay


@pytest.mark.parametrize("eta_in", [0.99, 0, -30], ids=["under-a-second", "now", "past"])
def test_an_eta_less_than_a_second_away_or_past_is_sent_at_once(eta_in: float) -> None:
    assert send_delay("jobs", task_message(eta_in), NOW) is None


def test_a_task_without_an_eta_is_sent_at_once() -> None:
    assert send_delay("jobs", task_message(None), NOW) is None


def test_a_fifo_queue_takes_no_delay() -> None:
    assert send_delay("jobs.fifo", task_message(60), NOW) is None


def test_a_redelivery_is_not_delayed() -> None:
    """kombu's restore makes the received message visible again; it sends nothing."""
    assert send_delay("jobs", {**task_message(60), "redelivered": True}, NOW) is None


@pytest.mark.parametrize("name", ["DelaySeconds", "delay_seconds"])
def test_a_delay_the_caller_set_is_kept(name: str) -> None:
    assert send_delay("jobs", task_message(60, **{name: 5}), NOW) is None


@pytest.mark.parametrize(
    "headers",
    [
        {"eta": "2026-11-28T12:05:00+00:00"},  # no task name: not a Celery task message
        {"task": "tasks.add", "eta": "soon"},  # an ETA that Celery itself would refuse
        None,
    ],
    ids=["not-celery", "unreadable-eta", "no-headers"],
)
def test_a_message_that_is_no_readable_celery_task_is_sent_at_once(headers: Any) -> None:
    message = {"body": "", "headers": headers, "properties": {}}

    assert send_delay("jobs", message, NOW) is None


def test_a_message_without_properties_is_sent_at_once() -> None:
    message = {k: v for k, v in task_message(60).items() if k != "properties"}

    assert send_delay("jobs", message, NOW) is None


def test_the_part_sets_the_delay_in_the_message_kombu_sends() -> None:
    message = task_message(120.5)

    SendDelays(True, FakeClock(NOW)).set_on("jobs", message)

    assert message["properties"]["DelaySeconds"] == 120


def test_the_part_reads_the_delay_from_its_wall_clock() -> None:
    message = task_message(120)

    SendDelays(True, FakeClock(NOW + 100)).set_on("jobs", message)

    assert message["properties"]["DelaySeconds"] == 20


@pytest.mark.parametrize(
    ("enabled", "queue", "eta_in"),
    [(False, "jobs", 120), (True, "jobs.fifo", 120), (True, "jobs", None)],
    ids=["opted-out", "fifo", "no-eta"],
)
def test_the_part_leaves_other_messages_as_they_were(
    enabled: bool, queue: str, eta_in: float | None
) -> None:
    message = task_message(eta_in)
    before = {**message["properties"]}

    SendDelays(enabled, FakeClock(NOW)).set_on(queue, message)

    assert message["properties"] == before
