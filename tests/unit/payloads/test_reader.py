"""The payload reader on its own: a fake channel port, no kombu channel."""

from __future__ import annotations

from typing import Any, ClassVar

from celery_sqs_heartbeat.leasing.lease_table import LeaseTable
from celery_sqs_heartbeat.payloads.options import PayloadAccess
from celery_sqs_heartbeat.payloads.reader import PayloadReader
from celery_sqs_heartbeat.payloads.store import PayloadStore
from celery_sqs_heartbeat.receiving.steps import Received


class Port:
    hub: Any = None
    closed = False
    _queue_cache: ClassVar[dict[str, str]] = {}

    def canonical_queue_name(self, queue_name: str) -> str:
        return queue_name

    def sqs(self, queue: str | None = None) -> Any:
        raise AssertionError("no call is needed")


class Manager:
    def release(self, leases: Any, reason: str) -> None:
        raise AssertionError("nothing to release")


def reader() -> PayloadReader:
    store = PayloadStore(None, PayloadAccess(frozenset()))
    return PayloadReader(Port(), store, Manager(), LeaseTable(), lambda: None)  # type: ignore[arg-type]


def test_a_batch_without_pointers_or_late_leases_stays_on_the_loop_as_it_is() -> None:
    part = reader()
    batch = [Received({"Body": "{}"}, None)]

    assert part.off_the_loop(batch, "jobs", lambda b: b, lambda b: b) is False
    assert part.read_bodies_now(batch, "jobs") is batch
    assert part.messages_reading == 0
    part.close()  # nothing being read: nothing released


def test_without_large_payloads_a_client_gets_no_send_hook() -> None:
    registered: list[str] = []

    class Events:
        def register(self, name: str, *args: Any, **kwargs: Any) -> None:
            registered.append(name)

    class Client:
        meta = type("Meta", (), {"events": Events()})()

    reader().offload_large_bodies(Client())  # type: ignore[arg-type]

    assert registered == []
