"""The intake on its own: fake steps, receiver, payload reader and manager; no kombu channel."""

from __future__ import annotations

from queue import Empty
from typing import Any

import pytest

from celery_sqs_heartbeat.leasing.lease_table import LeaseTable
from celery_sqs_heartbeat.leasing.leases import Lease
from celery_sqs_heartbeat.process import ProcessState
from celery_sqs_heartbeat.receiving.intake import Intake
from celery_sqs_heartbeat.receiving.steps import Received
from tests.unit.conftest import POLICY


class Port:
    closed = False
    connection: Any = None
    _noack_queues = frozenset[str]()

    def canonical_queue_name(self, queue_name: str) -> str:
        return queue_name

    def sqs(self, queue: str | None = None) -> Any:
        return object()

    def _new_queue(self, queue: str) -> str:
        return f"https://sqs/{queue}"


class Steps:
    """Every message gets a lease and is parked: a burst of countdown tasks."""

    def born(self, messages: Any, queue: Any, sent_at: float, held: bool = True) -> Any:
        return [Received(m, None) for m in messages]

    def confirm(self, batch: Any, queue: Any, sent_at: float) -> Any:
        return batch

    def known(self, batch: Any) -> Any:
        return batch

    def sort(self, batch: Any, queue: Any) -> tuple[list[Received], int]:
        return [], len(batch)


class Manager:
    def __init__(self) -> None:
        self.released: list[tuple[list[Any], str]] = []
        self.deleted: list[tuple[Lease, float]] = []

    def clock(self) -> float:
        return 0.0

    def delete(self, lease: Lease, wait: float) -> None:
        self.deleted.append((lease, wait))

    def release(self, leases: Any, reason: str) -> None:
        self.released.append((list(leases), reason))


class Blocking:
    in_bulk = True


class Receiver:
    blocking = Blocking()
    answer_sent_at = None


class Reader:
    def read_bodies_now(self, batch: Any, queue_name: str) -> Any:
        return batch


@pytest.fixture
def no_lease_queues(monkeypatch: pytest.MonkeyPatch, process_state: ProcessState) -> None:
    monkeypatch.setattr(process_state.lease_queues, "of", lambda *a: "q")


class LeasingSteps(Steps):
    """Every message gets a lease, counted from ``sent_at``."""

    def born(self, messages: Any, queue: Any, sent_at: float, held: bool = True) -> Any:
        return [
            Received(m, Lease(m["ReceiptHandle"], queue, POLICY, received_at=sent_at))
            for m in messages
        ]


def intake_of(
    manager: Manager, table: LeaseTable, receiver: Any = None, steps: Any = None
) -> Intake:
    return Intake(Port(), manager, table, steps or Steps(), receiver or Receiver(), Reader())  # type: ignore[arg-type]


def test_a_blocking_receive_that_only_parked_is_made_again(no_lease_queues: None) -> None:
    intake = intake_of(Manager(), LeaseTable())
    answers = [{"Messages": [{"ReceiptHandle": "rh-1"}]}, {"Messages": []}]
    made: list[int] = []

    def kombu_get_bulk() -> Any:
        response = intake.receive_message("jobs", lambda: answers[len(made)])
        made.append(1)
        if not response["Messages"]:
            raise Empty()
        return response

    with pytest.raises(Empty):
        intake.get_bulk(kombu_get_bulk)

    assert len(made) == 2


def test_what_nobody_claimed_goes_back_at_once() -> None:
    manager, table = Manager(), LeaseTable()
    lease = Lease(receipt_handle="rh-1", queue="q", policy=POLICY, received_at=0.0)
    table.admit(lease)

    intake_of(manager, table).release_unclaimed()

    assert manager.released == [([(lease, 0)], "not delivered")]


@pytest.mark.parametrize(("answer_sent_at", "received_at"), [(None, 0.0), (-5.0, -5.0)])
def test_a_no_ack_message_is_deleted_at_once_through_the_outbox(
    no_lease_queues: None, answer_sent_at: float | None, received_at: float
) -> None:
    manager, receiver = Manager(), Receiver()
    receiver.answer_sent_at = answer_sent_at  # type: ignore[assignment]

    intake = intake_of(manager, LeaseTable(), receiver, LeasingSteps())
    intake.delete_no_ack("mailbox", {"ReceiptHandle": "rh-1"})

    [(lease, wait)] = manager.deleted
    assert (lease.receipt_handle, lease.queue, lease.received_at, wait) == (
        "rh-1",
        "q",
        received_at,
        0,
    )
