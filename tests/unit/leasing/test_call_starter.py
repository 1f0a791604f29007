"""The check alone: what it takes from the book and the outbox, and the calls it starts."""

from __future__ import annotations

import logging

import pytest

from celery_sqs_heartbeat.leasing.call_answers import AnswerSettler
from celery_sqs_heartbeat.leasing.call_starter import CallStarter
from celery_sqs_heartbeat.leasing.leases import LONGEST_HIDE
from celery_sqs_heartbeat.leasing.manager_state import ManagerState
from celery_sqs_heartbeat.leasing.outbox import Outgoing, Request
from tests.unit.conftest import FakeClock, FakeQueue, make_lease
from tests.unit.leasing.conftest import PARTS_LOGGER


def starter_of(state: ManagerState) -> CallStarter:
    return CallStarter(state, AnswerSettler(state), PARTS_LOGGER)


def test_a_check_starts_the_due_renewals_then_the_due_deletes_and_waits_for_both(
    state: ManagerState, clock: FakeClock, queue: FakeQueue
) -> None:
    due, acked = make_lease(queue, task_id="due"), make_lease(queue, task_id="acked")
    state.book.add(due)
    state.book.add(acked)
    state.outbox.add(Outgoing(acked, Request.DELETE), 0)
    clock.now = 20
    starter = starter_of(state)

    starter.check(wait=True)

    assert queue.calls == [[(due, 30), (acked, 30)]]  # the delete waited for the renewal
    assert queue.deletes == [[acked]]
    assert list(state.book) == [due]
    assert starter.sends_unreported == 0


def test_with_no_free_renewal_slot_due_leases_stay_in_the_book(
    state: ManagerState, clock: FakeClock, queue: FakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = make_lease(queue)
    state.book.add(lease)
    clock.now = 20
    starter = starter_of(state)
    monkeypatch.setattr(starter.renewals, "limit", 0)

    starter.check(wait=False)

    assert queue.calls == []
    assert state.book.has_due(20) and not lease.renewing


def test_a_release_past_the_12_hours_goes_out_shortened_and_says_so(
    state: ManagerState, clock: FakeClock, queue: FakeQueue, caplog: pytest.LogCaptureFixture
) -> None:
    lease = make_lease(queue)
    state.outbox.add(Outgoing(lease, Request.RELEASE, delay=600, reason="rejected"), 0)
    clock.now = LONGEST_HIDE - 100
    caplog.set_level(logging.INFO, logger=PARTS_LOGGER.name)

    starter_of(state).check(wait=True)

    assert queue.calls == [[(lease, 100)]]
    assert "task tasks.crunch[id-1] 600 s -> 100 s" in caplog.text
