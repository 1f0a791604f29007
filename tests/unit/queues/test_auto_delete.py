"""The auto-delete queues part on its own: a fake channel port, kombu's cancel a callable."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from celery_sqs_heartbeat.process import ProcessState
from celery_sqs_heartbeat.queues.cleanup import AutoDeleteQueues

EVENT_QUEUE = "celeryev.0b0f7a58-5a2e-4d73-8d1a-7b5f0c2d9e11"


class Port:
    predefined_queues: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        self._tag_to_queue = {"first": EVENT_QUEUE, "second": EVENT_QUEUE}
        bound = [SimpleNamespace(exchange="celeryev")]
        self.state = SimpleNamespace(queue_bindings=lambda queue: bound)
        self.deleted: list[str] = []

    def basic_cancel(self, consumer_tag: str) -> Any:
        raise AssertionError("cancelled through the part")

    def queue_delete(self, queue: str) -> None:
        self.deleted.append(queue)


def kombu_cancel(port: Port) -> Any:
    return lambda tag: port._tag_to_queue.pop(tag)


def test_a_monitors_queue_is_deleted_once_its_last_consumer_is_cancelled(
    monkeypatch: pytest.MonkeyPatch, process_state: ProcessState
) -> None:
    monkeypatch.setattr(process_state.leftovers, "add_channel", lambda part, pid: None)
    port = Port()
    part = AutoDeleteQueues(port)
    part.declared(EVENT_QUEUE, auto_delete=True, passive=False)

    part.cancel("first", kombu_cancel(port))
    assert port.deleted == []
    part.cancel("second", kombu_cancel(port))
    assert port.deleted == [EVENT_QUEUE]


def test_a_queue_not_declared_auto_delete_here_stays() -> None:
    port = Port()
    part = AutoDeleteQueues(port)

    part.cancel("first", kombu_cancel(port))
    part.cancel("second", kombu_cancel(port))

    assert port.deleted == []
