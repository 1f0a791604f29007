"""What a failed receive does to its queue: a remote-control queue that is gone."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery.exceptions import WorkerShutdown

from celery_sqs_heartbeat.receiving.failures import ReceiveFailures
from celery_sqs_heartbeat.receiving.retries import classify_receive_error
from tests.unit.receiving.test_retries import client_error

BROADCAST = "celery_w1_host-celery-pidbox"


class Channel:
    """The consumers a channel has, and those cancelled."""

    def __init__(self) -> None:
        self._tag_to_queue = {"tag-1": BROADCAST, "tag-2": "celery"}
        self.cancelled: list[str] = []

    def canonical_queue_name(self, queue_name: str) -> str:
        return queue_name

    def basic_cancel(self, consumer_tag: str) -> None:
        self.cancelled.append(consumer_tag)
        del self._tag_to_queue[consumer_tag]


def test_receives_in_flight_when_a_remote_control_queue_went_say_so_once(
    caplog: pytest.LogCaptureFixture, process_state: Any
) -> None:
    """Found when a busy machine ran the integration suite: four receives of the deleted
    queue were in flight, and each logged it gone."""
    channel = Channel()
    failures = ReceiveFailures(channel, gate=None)  # type: ignore[arg-type]
    gone = classify_receive_error(client_error("QueueDoesNotExist"))

    with caplog.at_level(logging.WARNING, logger="celery_sqs_heartbeat.receiving.failures"):
        for _ in range(4):
            failures.failed(BROADCAST, gone)

    warnings = [r.getMessage() for r in caplog.records if "is gone" in r.getMessage()]
    assert len(warnings) == 1
    assert channel.cancelled == ["tag-1"]
    assert channel._tag_to_queue == {"tag-2": "celery"}


EVENT_QUEUE = "celeryev-006d4197-fff0-468c-b49c-f5d7ce81f131"


def test_a_receive_in_flight_when_its_consumer_left_stops_nothing(
    caplog: pytest.LogCaptureFixture, process_state: Any
) -> None:
    """Found when a busy machine ran the integration suite: Flower stopped, the channel
    cancelled its event consumer and deleted its queue at exit, a receive of that queue
    still in flight came back 'does not exist', and the worker-stopping error it raised
    in Flower's event thread interrupted the exit's cleanup before it unsubscribed the
    queue from its topic. A receive from a queue the channel no longer consumes is moot."""
    channel = Channel()
    channel._tag_to_queue = {"tag-2": "celery"}
    failures = ReceiveFailures(channel, gate=None)  # type: ignore[arg-type]
    gone = classify_receive_error(client_error("QueueDoesNotExist"))

    with caplog.at_level(logging.WARNING, logger="celery_sqs_heartbeat.receiving.failures"):
        failures.failed(EVENT_QUEUE, gone)

    assert caplog.records == []
    assert channel.cancelled == []


def test_a_task_queue_still_consumed_that_does_not_exist_stops_the_worker(
    caplog: pytest.LogCaptureFixture, process_state: Any
) -> None:
    channel = Channel()
    failures = ReceiveFailures(channel, gate=None)  # type: ignore[arg-type]
    gone = classify_receive_error(client_error("QueueDoesNotExist"))

    with pytest.raises(WorkerShutdown):
        failures.failed("celery", gone)

    assert "retrying cannot fix this" in caplog.text
