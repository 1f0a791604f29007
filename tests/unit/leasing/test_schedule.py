"""The renewal schedule alone: when held leases come due, without the book's rules."""

from __future__ import annotations

from celery_sqs_heartbeat.leasing.leases import AdaptiveMargin, Lease
from celery_sqs_heartbeat.leasing.schedule import RenewalBatch, RenewalSchedule
from tests.unit.conftest import make_lease


def schedule_of(*leases: Lease) -> RenewalSchedule:
    schedule = RenewalSchedule(AdaptiveMargin(interval=1.0))
    for lease in leases:
        schedule.add(lease)
    return schedule


def leases_of(batches: list[RenewalBatch]) -> list[Lease]:
    return [lease for batch in batches for lease, _ in batch.entries]


def test_a_held_lease_is_due_within_its_margin_of_expiry_and_marked_as_being_renewed() -> None:
    lease = make_lease("q")  # expires at 30, threshold 10
    schedule = schedule_of(lease)

    assert not schedule.has_due(19.9)
    assert schedule.due_batches(19.9) == []
    assert schedule.has_due(20)
    (batch,) = schedule.due_batches(20)

    assert batch == RenewalBatch("q", ((lease, 30),), 20)
    assert lease.renewing
    assert schedule.holds(lease)  # on the wire, still held
    assert schedule.due_batches(25) == []  # but not due again until it is put back


def test_renewed_puts_a_lease_back_by_its_new_expiry() -> None:
    lease = make_lease("q")
    schedule = schedule_of(lease)
    schedule.due_batches(20)

    lease.expires_at = 50  # what the book does with an answer
    schedule.renewed(lease)

    assert schedule.due_batches(39.9) == []
    assert leases_of(schedule.due_batches(40)) == [lease]


def test_a_lease_to_retry_is_due_at_its_retry_time_and_not_before() -> None:
    lease = make_lease("q")
    schedule = schedule_of(lease)
    schedule.due_batches(20)

    schedule.retry_at(lease, 21)

    assert not schedule.has_due(20.99)
    assert schedule.due_batches(20.99) == []
    assert schedule.has_due(21)
    assert leases_of(schedule.due_batches(21)) == [lease]


def test_a_discarded_lease_is_neither_put_back_nor_retried() -> None:
    renewed = make_lease("q", task_id="renewed")
    retried = make_lease("q", task_id="retried")
    schedule = schedule_of(renewed, retried)
    schedule.due_batches(20)

    schedule.discard(renewed)
    schedule.discard(retried)
    schedule.renewed(renewed)
    schedule.retry_at(retried, 21)

    assert not schedule.holds(renewed)
    assert not schedule.holds(retried)
    assert len(schedule) == 0
    assert schedule.due_batches(1_000) == []
    assert schedule._by_queue == {}  # the queue with nothing held is forgotten


def test_stale_entries_are_dropped_once_they_outnumber_the_live_ones() -> None:
    leases = [make_lease("q", received_at=n / 100, task_id=f"id-{n}") for n in range(100)]
    schedule = schedule_of(*leases)

    for lease in leases[:90]:
        schedule.discard(lease)

    assert len(schedule) == 10
    assert list(schedule) == leases[90:]
    assert len(schedule._by_queue["q", leases[0].policy].heap) <= 2 * len(schedule)


def test_take_exhausted_returns_and_forgets_due_leases_with_no_second_left() -> None:
    lease = make_lease("q")
    schedule = schedule_of(lease)
    now = lease.hold_deadline - 0.5  # due, and less than a second before the hold limit

    assert schedule.take_exhausted(now) == [lease]
    assert not schedule.holds(lease)
