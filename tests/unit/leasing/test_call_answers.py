"""The settling of each call's answer alone: what it does to the book and the outbox."""

from __future__ import annotations

import pytest

from celery_sqs_heartbeat.leasing.call_answers import AnswerSettler
from celery_sqs_heartbeat.leasing.leases import EntryResult
from celery_sqs_heartbeat.leasing.manager_state import ManagerState
from celery_sqs_heartbeat.leasing.outbox import Outgoing, Request
from tests.unit.conftest import FakeClock, FakeQueue, make_lease


def test_a_renewal_answer_renews_times_the_margin_and_frees_a_waiting_release(
    state: ManagerState, clock: FakeClock, queue: FakeQueue
) -> None:
    renewed, released = make_lease(queue, task_id="renewed"), make_lease(queue, task_id="gone")
    state.book.add(renewed)
    state.book.add(released)
    (batch,) = state.book.due_batches(20)
    assert state.book.end(released, 5, "rejected") is None  # waits for its renewal
    clock.now = 20.5
    woken: list[bool] = []
    state.changed.notify_all = lambda: woken.append(True)  # type: ignore[method-assign]

    AnswerSettler(state).renewal_answered(
        batch, {renewed: (EntryResult.OK, ""), released: (EntryResult.OK, "")}, 20
    )

    assert renewed.expires_at == 50 and renewed.renewals == 1
    assert list(state.book) == [renewed]
    assert state.book.margin.slowest_delay(20.5) == pytest.approx(0.5)
    (item,) = state.outbox
    assert (item.lease, item.request, item.delay) == (released, Request.RELEASE, 5)
    assert woken
    assert state.report.metrics.snapshot().leases_held == 1


def test_a_delete_answer_ends_the_confirmed_lease_and_renews_the_failed_one_again(
    state: ManagerState, clock: FakeClock, queue: FakeQueue
) -> None:
    done, failed = make_lease(queue, task_id="done"), make_lease(queue, task_id="failed")
    for lease in (done, failed):
        state.book.add(lease)
        state.outbox.add(Outgoing(lease, Request.DELETE), 0)
    (batch,) = state.outbox.due_batches(0)
    for lease in (done, failed):
        state.book.suspend(lease)
    clock.now = 0.2

    AnswerSettler(state).send_answered(
        batch, {done: (EntryResult.OK, ""), failed: (EntryResult.TRANSIENT, "InternalError")}
    )

    assert done.ended and not failed.ended
    assert list(state.book) == [failed]
    assert not failed.deleting  # renewed as before, its delete waiting to be tried again
    assert [item.lease for item in state.outbox] == [failed]
    assert state.report.metrics.snapshot().deletes_pending == 1
