"""The channel's lease table: received, delivered, adopted on redelivery, let go."""

from __future__ import annotations

from celery_sqs_heartbeat.leasing.lease_table import LeaseTable
from celery_sqs_heartbeat.leasing.leases import Lease
from tests.unit.conftest import POLICY


def received(handle: str, message_id: str | None = "m-1") -> Lease:
    return Lease(
        receipt_handle=handle, queue="q", policy=POLICY, received_at=0.0, message_id=message_id
    )


def test_a_claimed_lease_carries_its_task_until_it_is_let_go() -> None:
    table = LeaseTable()
    lease = received("rh-1")
    table.admit(lease)

    assert table.get("rh-1") is None  # not delivered yet
    assert table.claim("rh-1", "task-1", "tasks.crunch") is lease
    assert (lease.task_id, lease.task_name) == ("task-1", "tasks.crunch")
    assert table.get("rh-1") is lease
    assert table.let_go("rh-1") is lease
    assert table.let_go("rh-1") is None
    assert len(table) == 0


def test_a_message_not_received_here_is_not_claimed() -> None:
    assert LeaseTable().claim("rh-elsewhere", "task-1", "tasks.crunch") is None


def test_a_redelivery_of_a_delivered_message_takes_the_old_lease_s_place() -> None:
    table = LeaseTable()
    first = received("rh-1")
    table.admit(first)
    table.claim("rh-1", "task-1", "tasks.crunch")
    again = received("rh-2")

    assert table.adopt(again) is first
    assert table.get("rh-1") is again  # the consumer still knows it by its first tag
    assert (again.task_id, again.task_name) == ("task-1", "tasks.crunch")
    assert table.let_go("rh-1") is again
    assert table.adopt(received("rh-3")) is None  # let go: a new receive is a new message


def test_a_redelivery_of_a_copied_message_keeps_its_object_for_the_copy() -> None:
    """A parked task's fresh copy shares the S3 object: the delete by the new receipt
    must leave it, as the old one's would have."""
    table = LeaseTable()
    first = received("rh-1")
    first.copied = True
    table.admit(first)
    again = received("rh-2")

    assert table.adopt(again) is first
    assert again.copied


def test_a_redelivery_before_delivery_replaces_the_received_lease() -> None:
    table = LeaseTable()
    first = received("rh-1")
    table.admit(first)
    again = received("rh-2")

    assert table.adopt(again) is first
    assert table.claim("rh-1", "task-1", "tasks.crunch") is again


def test_messages_without_an_id_are_never_adopted() -> None:
    table = LeaseTable()
    table.admit(received("rh-1", message_id=None))

    assert table.adopt(received("rh-2", message_id=None)) is None


def test_what_no_consumer_claimed_is_taken_once_and_forgotten() -> None:
    table = LeaseTable()
    claimed, stranded = received("rh-1", "m-1"), received("rh-2", "m-2")
    table.admit(claimed)
    table.admit(stranded)
    table.claim("rh-1", "task-1", "tasks.crunch")

    assert table.take_unclaimed() == [stranded]
    assert table.take_unclaimed() == []
    assert table.adopt(received("rh-3", "m-2")) is None
    assert list(table.delivered()) == [("rh-1", claimed)]
