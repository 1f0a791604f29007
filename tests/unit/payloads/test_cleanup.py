"""The S3 objects of deleted messages: deleted after SQS's confirmation, off its call slot."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from celery_sqs_heartbeat.aws.clients import DerivedClients
from celery_sqs_heartbeat.payloads.cleanup import ObjectCleanup
from celery_sqs_heartbeat.payloads.pointers import S3Pointer
from tests.unit.conftest import make_lease


class SlowS3:
    """An S3 whose DeleteObjects answers only when told to."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self.answer = threading.Event()
        self.deleted = threading.Event()
        self.keys: list[str] = []

    def delete_objects(self, **request: Any) -> dict[str, Any]:
        self.called.set()
        self.answer.wait(30)
        self.keys += [entry["Key"] for entry in request["Delete"]["Objects"]]
        self.deleted.set()
        return {}


def test_the_objects_of_deleted_messages_go_without_holding_the_sqs_delete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 24, item 9: the DeleteObjects call ran inside the SQS delete's call slot, so
    a slow S3 held the slots SQS's deletes need."""
    s3 = SlowS3()
    clients = DerivedClients()
    monkeypatch.setattr(clients, "s3", lambda _: s3)
    cleanup = ObjectCleanup(clients)
    lease = make_lease("jobs")
    cleanup.remember(lease, (S3Pointer("tasks", "k-1"), None))

    deleting = threading.Thread(target=cleanup.deleted, args=(lambda: object(), [lease]))
    deleting.start()
    deleting.join(5)
    returned_at_once = not deleting.is_alive()
    s3.answer.set()

    assert returned_at_once
    assert s3.deleted.wait(5)
    assert s3.keys == ["k-1"]


def test_an_object_moves_to_the_new_receipt_that_deletes_its_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the chaos soak: a message received again after its lease lapsed is
    deleted by its new receipt, and the object, remembered for the old one, stayed."""
    s3 = SlowS3()
    s3.answer.set()
    clients = DerivedClients()
    monkeypatch.setattr(clients, "s3", lambda _: s3)
    cleanup = ObjectCleanup(clients)
    first, again = make_lease("jobs"), make_lease("jobs", receipt_handle="rh-again")
    cleanup.remember(first, (S3Pointer("tasks", "k-1"), None))

    cleanup.moved(first, again)
    cleanup.deleted(lambda: object(), [first])
    cleanup.deleted(lambda: object(), [again])

    assert s3.deleted.wait(5)
    assert s3.keys == ["k-1"]


def test_flush_waits_for_the_objects_handed_to_the_deleting_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the chaos soak: a gevent worker acked its last task in a warm shutdown and
    ended before its daemon thread deleted the message's object."""
    s3 = SlowS3()
    clients = DerivedClients()
    monkeypatch.setattr(clients, "s3", lambda _: s3)
    cleanup = ObjectCleanup(clients)
    leases = [make_lease("jobs", task_id=f"t-{n}") for n in range(2)]
    for n, lease in enumerate(leases):
        cleanup.remember(lease, (S3Pointer("tasks", f"k-{n}"), None))
    cleanup.deleted(lambda: object(), leases)
    assert s3.called.wait(5)

    waiting = cleanup.flush(0)
    s3.answer.set()
    left = cleanup.flush(5)

    assert waiting == 2
    assert left == 0
    assert s3.keys == ["k-0", "k-1"]


def no_client() -> Any:
    raise RuntimeError("no client")


def test_flush_counts_an_object_whose_delete_failed_as_tried() -> None:
    """A failure is logged and left to the lifecycle rule: nothing to wait for."""
    cleanup = ObjectCleanup(DerivedClients())
    lease = make_lease("jobs")
    cleanup.remember(lease, (S3Pointer("tasks", "k-1"), None))

    cleanup.deleted(no_client, [lease])

    assert cleanup.flush(5) == 0


def test_flush_with_nothing_handed_over_returns_at_once() -> None:
    assert ObjectCleanup(DerivedClients()).flush(0) == 0
