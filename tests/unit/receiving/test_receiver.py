"""The receiver on its own: a fake channel port, kombu's steps as plain callables."""

from __future__ import annotations

from queue import Empty
from typing import Any

import pytest
from botocore.exceptions import ClientError

from celery_sqs_heartbeat.receiving.receiver import Receiver
from tests.unit.conftest import FakeClock


class Qos:
    prefetch_count = 10

    def __init__(self, room: int | None) -> None:
        self.room = room

    def can_consume_max_estimate(self) -> int | None:
        return self.room


class Port:
    """The few things of a kombu channel the receiver reads."""

    hub: Any = None
    closed = False
    visibility_timeout = 30
    wait_time_seconds = 10

    def __init__(self, room: int | None = None) -> None:
        self.qos = Qos(room)
        self._active_queues: list[str] = ["jobs"]
        self._tag_to_queue: dict[str, str] = {}
        self._consumers: set[str] = {"consumer"}

    def canonical_queue_name(self, queue_name: str) -> str:
        return queue_name

    def basic_cancel(self, consumer_tag: str) -> Any:
        raise AssertionError("not expected")

    def sqs(self, queue: str | None = None) -> Any:
        raise AssertionError("not expected")

    def _new_queue(self, queue: str) -> str:
        return f"https://sqs/{queue}"

    def _send_long_poll(self, *args: Any) -> None:
        raise AssertionError("not expected")


def receiver(port: Port, clock: FakeClock) -> Receiver:
    return Receiver(port, clock, lambda queue: None, lambda: 1.0)  # type: ignore[arg-type]


def throttled() -> ClientError:
    return ClientError({"Error": {"Code": "ThrottlingException"}}, "ReceiveMessage")


def test_a_failed_blocking_receive_reads_as_empty_and_the_next_waits_out_its_backoff() -> None:
    clock = FakeClock()
    part = receiver(Port(), clock)
    calls: list[dict[str, Any]] = []

    def kombu_receive(queue: str, **kwargs: Any) -> Any:
        calls.append(kwargs)
        raise throttled()

    with pytest.raises(Empty):
        part.receive_message("jobs", {"max_number_of_messages": 10}, kombu_receive)
    with pytest.raises(Empty):
        part.receive_message("jobs", {"max_number_of_messages": 10}, kombu_receive)

    assert calls == [{"max_number_of_messages": 10}]  # the second waited, without a call


def test_a_fifo_queue_receives_one_message_at_a_time() -> None:
    part = receiver(Port(), FakeClock())
    asked: list[dict[str, Any]] = []

    def kombu_receive(queue: str, **kwargs: Any) -> Any:
        asked.append(kwargs)
        return {"Messages": []}

    part.receive_message("jobs.fifo", {"max_number_of_messages": 10}, kombu_receive)

    assert asked == [{"max_number_of_messages": 1}]


def test_a_drain_with_the_window_full_times_out_without_asking_kombu() -> None:
    part = receiver(Port(room=0), FakeClock())
    drained: list[bool] = []

    with pytest.raises(TimeoutError):
        part.drain_events(1.0, lambda: drained.append(True))
    assert drained == []
    assert receiver(Port(room=5), FakeClock()).drain_events(1.0, lambda: "kombu's") == "kombu's"


def test_the_blocking_path_is_marked_while_kombus_get_bulk_runs() -> None:
    part = receiver(Port(), FakeClock())
    seen = part.get_bulk(lambda: part.in_bulk)

    assert seen is True and part.in_bulk is False
