"""Lease bookkeeping: when leases come due, how they are batched, what an answer does."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import pytest

from celery_sqs_heartbeat.aws.sqs_facts import SQS_BATCH_SIZE
from celery_sqs_heartbeat.leasing.book import LeaseBook, Settlement
from celery_sqs_heartbeat.leasing.leases import (
    AdaptiveMargin,
    EntryResult,
    Lease,
    LeasePolicy,
    Release,
)
from celery_sqs_heartbeat.leasing.schedule import LOOKS_PER_BATCH, RenewalBatch
from tests.unit.conftest import POLICY, make_lease

OK = (EntryResult.OK, "")

#: received_at + 43200 - 60: where SQS's 12-hour limit, less the margin, stops renewals.
HOLD_LIMIT = 43140


def book_of(*leases: Lease) -> LeaseBook:
    book = LeaseBook()
    for lease in leases:
        book.add(lease)
    return book


def answer(batch: RenewalBatch, result: EntryResult, reason: str = "") -> dict:
    return {lease: (result, reason) for lease, _ in batch.entries}


def leases_of(batches: Iterable[RenewalBatch]) -> list[Lease]:
    return [lease for batch in batches for lease, _ in batch.entries]


def renew_until_untracked(book: LeaseBook, lease: Lease) -> list[Settlement]:
    """Renew ``lease`` every time it comes due, SQS always agreeing, until it is dropped."""
    settlements = []
    for _ in range(3000):  # 12 hours of 20-second renewals is 2157
        if not len(book):
            return settlements
        now = lease.expires_at - 10  # POLICY's threshold
        assert not book.take_exhausted(now)
        (batch,) = book.due_batches(now)
        settlements.append(book.settle(batch, answer(batch, EntryResult.OK), now + 0.2))
    pytest.fail("the lease is still renewed after 3000 renewals")


# --- when a lease is due -------------------------------------------------------------


def test_a_new_lease_expires_one_visibility_timeout_after_the_receive() -> None:
    lease = make_lease("q", received_at=100)

    assert lease.expires_at == 130
    book = book_of(lease)
    assert not book.has_due(119.9)
    assert book.has_due(120)


def test_nothing_due_means_no_batch() -> None:
    lease = make_lease("q", received_at=0)
    book = book_of(lease)

    assert book.due_batches(19.9) == []
    assert not lease.renewing


def test_an_empty_book_has_no_batch() -> None:
    assert LeaseBook().due_batches(1000) == []


def test_a_lease_is_due_once_within_the_threshold_of_its_expiry() -> None:
    lease = make_lease("q", received_at=0)
    book = book_of(lease)

    batches = book.due_batches(20)

    assert batches == [RenewalBatch("q", ((lease, 30),), 20)]
    assert lease.renewing


def test_a_lease_being_renewed_is_not_picked_again() -> None:
    lease = make_lease("q")
    book = book_of(lease)
    book.due_batches(20)

    assert book.due_batches(21) == []
    assert book.take_exhausted(21) == []


def test_batches_group_by_queue_and_never_mix_queues() -> None:
    first = [make_lease("q1", received_at=i, task_id=f"a{i}") for i in range(3)]
    second = [make_lease("q2", received_at=i, task_id=f"b{i}") for i in range(2)]
    book = book_of(*first, *second)

    batches = book.due_batches(30)

    assert sorted(batch.queue for batch in batches) == ["q1", "q2"]
    for batch in batches:
        assert {lease.queue for lease, _ in batch.entries} == {batch.queue}
    assert set(leases_of(batches)) == {*first, *second}


def test_a_queue_with_nothing_due_gets_no_batch_even_when_another_queue_has() -> None:
    due = make_lease("q1", received_at=0)
    not_due = make_lease("q2", received_at=5)
    book = book_of(due, not_due)

    batches = book.due_batches(20)

    assert [batch.queue for batch in batches] == ["q1"]
    assert not not_due.renewing


def test_one_due_lease_fills_its_call_with_the_ten_closest_to_due() -> None:
    # Due at 20, 21, ... 34: only the first is due at 20.
    leases = [make_lease("q", received_at=i, task_id=str(i)) for i in range(15)]
    book = book_of(*reversed(leases))

    (batch,) = book.due_batches(20)

    assert [lease for lease, _ in batch.entries] == leases[:10]
    assert all(length == 30 for _, length in batch.entries)
    assert not any(lease.renewing for lease in leases[10:])


def test_a_cohort_renewed_together_comes_due_together() -> None:
    leases = [make_lease("q", received_at=i, task_id=str(i)) for i in range(5)]
    book = book_of(*leases)
    (batch,) = book.due_batches(20)
    book.settle(batch, answer(batch, EntryResult.OK), 20.3)

    assert {lease.expires_at for lease in leases} == {50}
    assert book.due_batches(39.9) == []
    (next_batch,) = book.due_batches(40)
    assert len(next_batch.entries) == 5


def test_25_due_leases_make_3_calls_of_10_filled_with_the_closest_not_yet_due() -> None:
    due = [make_lease("q", received_at=i / 10, task_id=f"due{i}") for i in range(25)]
    later = [make_lease("q", received_at=5 + i, task_id=f"later{i}") for i in range(10)]
    book = book_of(*later, *due)

    batches = book.due_batches(22.5)

    assert [len(batch.entries) for batch in batches] == [10, 10, 10]
    chosen = leases_of(batches)
    assert len(set(chosen)) == 30
    assert set(chosen) == {*due, *later[:5]}
    assert not any(lease.renewing for lease in later[5:])


def test_no_batch_holds_more_than_ten_entries() -> None:
    leases = [make_lease("q", received_at=0, task_id=str(i)) for i in range(101)]
    book = book_of(*leases)

    batches = book.due_batches(20)

    assert [len(batch.entries) for batch in batches] == [10] * 10 + [1]
    assert set(leases_of(batches)) == set(leases)


# --- what an answer does ----------------------------------------------------------------


def test_ok_moves_the_expiry_to_send_time_plus_length_and_counts_the_renewal() -> None:
    lease = make_lease("q")
    book = book_of(lease)
    (batch,) = book.due_batches(20)

    settlement = book.settle(batch, answer(batch, EntryResult.OK), now=21.5)

    assert lease.expires_at == 50
    assert lease.renewals == 1
    assert not lease.renewing
    assert settlement == Settlement(renewed=[(lease, 30)])
    assert book.due_batches(39.9) == []
    assert leases_of(book.due_batches(40)) == [lease]


def test_renewals_are_counted_across_renewals() -> None:
    lease = make_lease("q")
    book = book_of(lease)
    for now in (20, 40, 60):
        (batch,) = book.due_batches(now)
        book.settle(batch, answer(batch, EntryResult.OK), now)

    assert lease.renewals == 3
    assert lease.expires_at == 90


def test_lost_removes_the_lease_and_reports_it_with_the_reason() -> None:
    lease = make_lease("q")
    book = book_of(lease)
    (batch,) = book.due_batches(20)

    settlement = book.settle(batch, answer(batch, EntryResult.LOST, "MessageNotInflight"), 20.5)

    assert settlement.lost == [(lease, "MessageNotInflight")]
    assert settlement.renewed == []
    assert len(book) == 0
    assert book.due_batches(1000) == []


def test_transient_keeps_the_lease_for_the_next_check_while_it_has_time() -> None:
    lease = make_lease("q")
    book = book_of(lease)
    (batch,) = book.due_batches(20)

    settlement = book.settle(batch, answer(batch, EntryResult.TRANSIENT, "Throttling"), 20.5)

    assert settlement == Settlement()
    assert lease.expires_at == 30
    assert leases_of(book.due_batches(21)) == [lease]


def test_a_failed_renewal_is_retried_one_check_interval_after_it_was_sent_not_sooner() -> None:
    """Issue 33: the manager checks whenever the outbox wakes it; a retry waits for its check."""
    lease = make_lease("q")
    book = LeaseBook(AdaptiveMargin(interval=1.0))
    book.add(lease)
    (batch,) = book.due_batches(20)
    book.settle(batch, answer(batch, EntryResult.TRANSIENT, "Throttling"), 20.05)

    assert not book.has_due(20.99)
    assert book.due_batches(20.99) == []
    assert book.take_exhausted(20.99) == []
    assert book.has_due(21)
    assert leases_of(book.due_batches(21)) == [lease]


def test_a_lease_waiting_to_retry_does_not_fill_another_call() -> None:
    failed = make_lease("q", task_id="failed")
    book = book_of(failed)
    (batch,) = book.due_batches(20)
    book.settle(batch, answer(batch, EntryResult.TRANSIENT, "Throttling"), 20.05)
    due = make_lease("q", received_at=0.5, task_id="due")
    book.add(due)

    assert leases_of(book.due_batches(20.5)) == [due]
    assert leases_of(book.due_batches(21)) == [failed]


def test_a_lease_ended_while_waiting_to_retry_is_not_renewed_again() -> None:
    ended = make_lease("q", task_id="ended")
    held = make_lease("q", task_id="held")
    book = book_of(ended, held)
    (batch,) = book.due_batches(20)
    book.settle(batch, answer(batch, EntryResult.TRANSIENT, "Throttling"), 20.05)

    book.end(ended)

    assert leases_of(book.due_batches(21)) == [held]
    assert list(book) == [held]


def test_transient_reports_the_lease_lost_once_it_ran_out() -> None:
    lease = make_lease("q")
    book = book_of(lease)
    (batch,) = book.due_batches(29)

    settlement = book.settle(batch, answer(batch, EntryResult.TRANSIENT, "Throttling"), 30)

    ((reported, reason),) = settlement.lost
    assert reported is lease
    assert "ran out" in reason
    assert "Throttling" in reason
    assert len(book) == 0


def test_an_entry_without_an_answer_counts_as_transient() -> None:
    kept = make_lease("q", task_id="kept")
    expired = make_lease("q", received_at=-1, task_id="expired")
    book = book_of(kept, expired)
    (batch,) = book.due_batches(20)

    early = book.settle(batch, {}, 20.5)
    assert early == Settlement()
    (batch,) = book.due_batches(29)
    late = book.settle(batch, {}, 29.5)

    assert late.lost == [(expired, "lease ran out while renewals failed: no answer")]
    assert len(book) == 1


def test_settle_reports_each_lease_of_a_mixed_answer() -> None:
    ok, gone, retry = (make_lease("q", task_id=name) for name in ("ok", "gone", "retry"))
    book = book_of(ok, gone, retry)
    (batch,) = book.due_batches(20)

    settlement = book.settle(
        batch,
        {
            ok: (EntryResult.OK, ""),
            gone: (EntryResult.LOST, "ReceiptHandleIsInvalid"),
            retry: (EntryResult.TRANSIENT, "InternalError"),
        },
        20.5,
    )

    assert settlement.renewed == [(ok, 30)]
    assert settlement.lost == [(gone, "ReceiptHandleIsInvalid")]
    retried = leases_of(book.due_batches(21))
    assert retry in retried
    assert gone not in retried


# --- how long a message may be held ------------------------------------------------------


@pytest.mark.parametrize("received_at", [0, 1000.5])
def test_renewals_stop_at_sqs_12_hour_limit_less_the_margin(received_at: float) -> None:
    lease = make_lease("q", received_at=received_at)
    book = book_of(lease)

    settlements = renew_until_untracked(book, lease)

    lengths = [length for s in settlements for _, length in s.renewed]
    assert lengths[:-1] == [30] * (len(lengths) - 1)
    assert 1 <= lengths[-1] < 30
    assert lease.expires_at <= received_at + HOLD_LIMIT
    assert lease.expires_at > received_at + HOLD_LIMIT - 1
    assert [s.capped for s in settlements[:-1]] == [[]] * (len(settlements) - 1)
    assert settlements[-1].capped == [lease]
    assert len(book) == 0


def test_the_capped_renewal_is_the_remaining_time_to_the_limit() -> None:
    lease = make_lease("q", received_at=0)
    lease.expires_at = 43125  # as after many renewals
    book = book_of(lease)

    (batch,) = book.due_batches(43115)

    assert batch.entries == ((lease, HOLD_LIMIT - 43115),)
    settlement = book.settle(batch, answer(batch, EntryResult.OK), 43115.5)
    assert settlement.renewed == [(lease, 25)]
    assert settlement.capped == [lease]
    assert lease.expires_at == HOLD_LIMIT
    assert book.due_batches(43139) == []


def test_visibility_extension_max_caps_before_the_12_hours() -> None:
    policy = LeasePolicy(visibility_timeout=30, threshold=10, max_hold=100)
    lease = make_lease("q", received_at=50, policy=policy)
    book = book_of(lease)

    settlements = renew_until_untracked(book, lease)

    assert [length for s in settlements for _, length in s.renewed] == [30, 30, 30, 20]
    assert settlements[-1].capped == [lease]
    assert lease.expires_at == 150


def test_a_max_hold_beyond_12_hours_is_still_capped_by_sqs_limit() -> None:
    policy = LeasePolicy(visibility_timeout=30, threshold=10, max_hold=43200)

    assert policy.hold_limit == HOLD_LIMIT


@pytest.mark.parametrize(
    ("received_at", "wanted", "now", "sent"),
    [
        (0, 600, 100, 600),  # well within the 12 hours: as asked
        (0, 43_200, 1000, HOLD_LIMIT - 1000),  # a failure's backoff of 12 hours
        (0, 43_140, 150, HOLD_LIMIT - 150),  # a park's longest hop, sent after its wait
        (1000.5, 43_200, 1000.5, HOLD_LIMIT),  # whole seconds, never past the limit
        (0, 600, HOLD_LIMIT - 0.5, 0),  # no whole second left
        (0, 600, 50_000, 0),  # long past the 12 hours: visible now, never negative
        (0, 0, 50_000, 0),
    ],
)
def test_a_visibility_change_is_capped_at_sqs_12_hours_from_the_receive_less_the_margin(
    received_at: float, wanted: int, now: float, sent: int
) -> None:
    lease = make_lease("q", received_at=received_at)

    assert lease.capped_visibility(wanted, now) == sent


def test_the_cap_ignores_visibility_extension_max_unless_asked_to_stop_sooner() -> None:
    """``max_hold`` is how long the worker renews, not how long a release may hide."""
    policy = LeasePolicy(visibility_timeout=30, threshold=10, max_hold=100)
    lease = make_lease("q", policy=policy)

    assert lease.capped_visibility(600, 50) == 600
    assert lease.capped_visibility(30, 80, until=lease.hold_deadline) == 20


def test_a_renewal_sqs_refuses_as_past_its_12_hours_is_capped_not_lost() -> None:
    """SQS's clock started before ours: the lease is at its hold limit, by SQS's count."""
    refused, renewed = make_lease("q", task_id="refused"), make_lease("q", task_id="renewed")
    book = book_of(refused, renewed)
    (batch,) = book.due_batches(20)

    settlement = book.settle(
        batch,
        {
            refused: (EntryResult.BEYOND_LIMIT, "InvalidParameterValue: beyond the limit"),
            renewed: OK,
        },
        20.5,
    )

    assert settlement.capped == [refused]
    assert settlement.lost == []
    assert settlement.renewed == [(renewed, 30)]
    assert refused.expires_at == 30  # the last renewal SQS took still holds
    assert list(book) == [renewed]


def test_take_exhausted_returns_due_leases_that_cannot_get_a_second() -> None:
    # Due half a second before its hold limit: no whole second is left to ask for.
    policy = LeasePolicy(visibility_timeout=30, threshold=0.5, max_hold=30)
    lease = make_lease("q", policy=policy)
    book = book_of(lease)

    assert book.take_exhausted(29.4) == []
    assert book.take_exhausted(29.5) == [lease]
    assert len(book) == 0
    assert book.due_batches(29.5) == []


def test_a_due_lease_with_no_whole_second_left_is_never_renewed_for_0_seconds() -> None:
    policy = LeasePolicy(visibility_timeout=30, threshold=0.5, max_hold=30)
    exhausted = make_lease("q", policy=policy, task_id="exhausted")
    other = make_lease("q", received_at=0, task_id="other")
    book = book_of(exhausted, other)

    batches = book.due_batches(29.5)  # without take_exhausted first

    assert exhausted not in leases_of(batches)
    assert all(length >= 1 for batch in batches for _, length in batch.entries)


def test_a_lease_with_exactly_one_second_left_is_renewed_for_one_second() -> None:
    policy = LeasePolicy(visibility_timeout=30, threshold=1.5, max_hold=30)
    lease = make_lease("q", policy=policy)
    book = book_of(lease)

    assert book.take_exhausted(28.5) == []
    (batch,) = book.due_batches(28.5)
    assert batch.entries == ((lease, 1),)


def test_take_exhausted_leaves_leases_that_are_not_due_or_being_renewed() -> None:
    policy = LeasePolicy(visibility_timeout=30, threshold=1.5, max_hold=30)
    in_flight = make_lease("q", policy=policy, task_id="in-flight")
    not_due = make_lease("other", received_at=10, policy=policy, task_id="not-due")
    book = book_of(in_flight, not_due)
    (batch,) = book.due_batches(28.5)  # renewed for 1 second, on the wire
    assert batch.entries == ((in_flight, 1),)

    assert book.take_exhausted(29.6) == []
    assert len(book) == 2


# --- the cost of a check -------------------------------------------------------------------


@dataclass(eq=False)
class WatchedLease(Lease):
    """Counts how often a check works out a lease's renewal length: once per lease looked at."""

    looks: int = 0

    @property
    def hold_deadline(self) -> float:
        self.looks += 1
        return super().hold_deadline


def watched_leases(count: int, queue: str = "q") -> list[WatchedLease]:
    """``count`` leases received over 10 seconds: the first comes due at 20."""
    return [
        WatchedLease(
            receipt_handle=f"rh-{n}",
            queue=queue,
            policy=POLICY,
            received_at=10 * n / count,
            task_id=f"id-{n}",
        )
        for n in range(count)
    ]


def looks(leases: Iterable[WatchedLease]) -> int:
    return sum(lease.looks for lease in leases)


def test_a_check_with_nothing_due_looks_at_no_lease() -> None:
    leases = watched_leases(10_000)
    book = book_of(*leases)

    assert book.take_exhausted(19.9) == []
    assert book.due_batches(19.9) == []
    assert looks(leases) == 0


def test_a_check_renewing_a_few_looks_at_those_and_the_ones_filling_the_call() -> None:
    leases = watched_leases(10_000)
    book = book_of(*leases)

    exhausted = book.take_exhausted(20.002)  # three are due: 0, 0.001 and 0.002
    (batch,) = book.due_batches(20.002)

    assert exhausted == []
    assert leases_of([batch]) == leases[:10]
    # The ten in the call, each looked at a few times; none of the other 9,990.
    assert looks(leases[10:]) == 0
    assert looks(leases) <= 3 * 10


def test_ended_leases_do_not_pile_up_behind_the_live_ones() -> None:
    leases = watched_leases(1_000)
    book = book_of(*leases)
    for lease in leases[:990]:
        book.end(lease)

    assert len(book) == 10
    assert len(book._schedule._by_queue["q", POLICY].heap) <= 2 * len(book)
    (batch,) = book.due_batches(30)
    assert leases_of([batch]) == leases[990:]


def test_a_queue_whose_leases_all_ended_is_forgotten() -> None:
    leases = watched_leases(30)
    book = book_of(*leases)
    for lease in leases:
        book.end(lease)

    assert book._schedule._by_queue == {}
    assert book.due_batches(1_000) == []


# --- ending a lease -----------------------------------------------------------------------


def test_end_without_a_delay_stops_renewals_and_releases_nothing() -> None:
    lease = make_lease("q")
    book = book_of(lease)

    assert book.end(lease) is None
    assert lease.ended
    assert len(book) == 0
    assert book.due_batches(20) == []


def test_end_of_an_idle_lease_with_a_delay_returns_its_release() -> None:
    lease = make_lease("q")
    book = book_of(lease)

    release = book.end(lease, 60, "failure")

    assert release == Release(lease, 60, "failure")
    assert not book.releases_waiting()
    assert book.due_batches(20) == []


def test_a_lease_whose_delete_is_on_the_wire_is_still_renewed() -> None:
    """A slow delete must not outlast the lease: SQS would hand the task to another worker."""
    deleting = make_lease("q", task_id="deleting")
    running = make_lease("q", task_id="running")
    book = book_of(deleting, running)

    book.suspend(deleting)

    assert leases_of(book.due_batches(20)) == [deleting, running]


def test_a_renewal_refused_while_the_delete_is_on_the_wire_is_not_a_loss() -> None:
    """The delete landed first; if it then fails, the lease is renewed again at once."""
    deleting = make_lease("q", task_id="deleting")
    lost = make_lease("q", task_id="lost")
    book = book_of(deleting, lost)
    book.suspend(deleting)
    (batch,) = book.due_batches(20)

    settlement = book.settle(batch, answer(batch, EntryResult.LOST, "ReceiptHandleIsInvalid"), 21)

    assert [lease for lease, _ in settlement.lost] == [lost]
    assert list(book) == []
    book.resume(deleting)  # its delete failed
    assert leases_of(book.due_batches(22)) == [deleting]


def test_resume_takes_back_neither_an_ended_lease_nor_a_held_one_twice() -> None:
    ended = make_lease("q", task_id="ended")
    held = make_lease("q", task_id="held")
    book = book_of(ended, held)
    book.suspend(ended)
    book.end(ended)

    book.resume(ended)
    book.resume(held)

    assert list(book) == [held]


def test_a_lease_of_a_connection_without_renewals_is_never_renewed_even_after_a_failed_delete() -> (
    None
):
    """The review of a flaky CI run: a retried delete took such a lease into the schedule,
    where the manager, given no check interval, slept forever and its thread died."""
    lease = make_lease("q", policy=replace(POLICY, renewed=False))
    book = book_of(lease)
    book.suspend(lease)  # its delete went out
    book.resume(lease)  # and failed

    assert list(book) == []
    assert book.due_batches(1_000) == []


def test_end_twice_is_harmless() -> None:
    lease = make_lease("q")
    book = book_of(lease)

    assert book.end(lease, 5, "failure") is not None
    assert book.end(lease, 5, "failure") is None
    assert book.end(lease) is None
    assert len(book) == 0


def test_an_ended_lease_is_never_added_again() -> None:
    """Issue 31, item 7: a late answer's confirmation tracked a lease that the channel's
    close had released meanwhile, and it was renewed for as long as the process lived."""
    lease = make_lease("q")
    book = book_of(lease)
    book.end(lease, 0, "shutdown")

    book.add(lease)

    assert list(book) == []
    assert book.due_batches(1000) == []


def test_release_of_a_lease_being_renewed_waits_for_that_renewal_to_come_back() -> None:
    lease = make_lease("q")
    book = book_of(lease)
    (batch,) = book.due_batches(20)

    assert book.end(lease, 60, "failure") is None
    assert book.releases_waiting()
    assert book.end(lease, 60, "failure") is None
    assert book.take_exhausted(25) == []
    assert book.due_batches(25) == []
    assert book.releases_waiting()

    settlement = book.settle(batch, answer(batch, EntryResult.OK), 20.5)

    assert settlement == Settlement(releases=[Release(lease, 60, "failure")])
    assert not book.releases_waiting()
    assert lease.renewals == 0


@pytest.mark.parametrize("result", list(EntryResult))
def test_a_lease_acked_while_being_renewed_is_not_tracked_again_whatever_the_answer(
    result: EntryResult,
) -> None:
    lease = make_lease("q")
    book = book_of(lease)
    (batch,) = book.due_batches(29)
    book.end(lease)

    settlement = book.settle(batch, answer(batch, result, "x"), 31)

    assert settlement == Settlement()
    assert len(book) == 0
    assert book.due_batches(1000) == []


def test_only_the_ended_lease_of_a_batch_waits_for_the_answer() -> None:
    ended, kept = make_lease("q", task_id="ended"), make_lease("q", task_id="kept")
    book = book_of(ended, kept)
    (batch,) = book.due_batches(20)
    book.end(ended, 0, "shutdown")

    settlement = book.settle(batch, answer(batch, EntryResult.OK), 20.5)

    assert settlement.releases == [Release(ended, 0, "shutdown")]
    assert settlement.renewed == [(kept, 30)]
    assert len(book) == 1


def test_the_hold_limit_is_12_hours_less_the_margin_by_default() -> None:
    assert POLICY.max_hold is None
    assert POLICY.hold_limit == HOLD_LIMIT


# --- a check in chunks ---------------------------------------------------------------------


def test_a_limited_pass_takes_at_most_limit_calls_and_looks_at_a_bounded_number() -> None:
    leases = watched_leases(10_000)
    book = book_of(*leases)
    now = 21.0  # 1,001 due: received from 0 to 1.0
    renewed: list[Lease] = []
    passes = 0
    while book.has_due(now):
        before = book.looked_at
        batches = book.due_batches(now, limit=2)
        assert len(batches) <= 2
        assert book.looked_at - before <= 2 * LOOKS_PER_BATCH
        before = book.looked_at
        assert book.take_exhausted(now, limit=2 * LOOKS_PER_BATCH) == []
        assert book.looked_at - before <= 2 * LOOKS_PER_BATCH
        renewed.extend(leases_of(batches))
        passes += 1

    # Each due lease once, and nine more to fill the last call.
    assert len(renewed) == len(set(map(id, renewed))) == 1010
    assert {id(lease) for lease in leases[:1001]} <= set(map(id, renewed))
    assert passes >= 1010 // (2 * SQS_BATCH_SIZE)


def test_stale_entries_of_acked_leases_count_against_the_limit() -> None:
    leases = watched_leases(10_000)
    book = book_of(*leases)
    for lease in leases[:4000:2]:  # acked, their entries left in the heap
        book.end(lease)

    before = book.looked_at
    book.due_batches(30, limit=1)

    assert book.looked_at - before <= LOOKS_PER_BATCH


def test_a_limited_pass_takes_the_queues_in_turn() -> None:
    first = [make_lease("a", task_id=f"a{n}") for n in range(30)]
    second = [make_lease("b", task_id=f"b{n}") for n in range(30)]
    book = book_of(*first, *second)

    queues = [batch.queue for batch in book.due_batches(20, limit=1)]
    queues += [batch.queue for batch in book.due_batches(20, limit=1)]

    assert sorted(queues) == ["a", "b"]


def test_two_policies_on_one_queue_are_renewed_in_separate_calls() -> None:
    other = LeasePolicy(visibility_timeout=60, threshold=10.0)
    short = make_lease("q", task_id="short")
    long = make_lease("q", received_at=-30, policy=other, task_id="long")
    book = book_of(short, long)

    batches = book.due_batches(20)

    assert sorted([lease.task_id for lease in leases_of([batch])] for batch in batches) == [
        ["long"],
        ["short"],
    ]


# --- the adaptive margin -------------------------------------------------------------------

ADAPTIVE = LeasePolicy(visibility_timeout=30)


def test_the_margin_is_the_ceiling_until_a_renewal_was_timed() -> None:
    margin = AdaptiveMargin(interval=1.0)

    assert margin.seconds(ADAPTIVE, 0) == 10
    assert margin.seconds(LeasePolicy(visibility_timeout=8), 0) == 4


def test_the_margin_is_interval_safety_and_twice_the_slowest_recent_delay() -> None:
    margin = AdaptiveMargin(interval=1.0)
    margin.record_delay(0.05, now=100)
    assert margin.seconds(ADAPTIVE, 100) == pytest.approx(1 + 3 + 0.1)

    margin.record_delay(2.0, now=101)
    margin.record_delay(0.05, now=102)
    assert margin.seconds(ADAPTIVE, 102) == pytest.approx(8)
    # A minute later the slow call is forgotten; the last delay stands alone.
    assert margin.seconds(ADAPTIVE, 161.5) == pytest.approx(4.1)
    # With no call for a long time, the last delay is kept.
    assert margin.seconds(ADAPTIVE, 10_000) == pytest.approx(4.1)


def test_the_margin_never_exceeds_half_the_lease_nor_10_seconds() -> None:
    margin = AdaptiveMargin(interval=1.0)
    margin.record_delay(30.0, now=0)

    assert margin.seconds(ADAPTIVE, 0) == 10
    assert margin.seconds(LeasePolicy(visibility_timeout=8), 0) == 4


def test_a_failed_renewal_widens_the_margin_to_the_ceiling_for_a_minute() -> None:
    margin = AdaptiveMargin(interval=1.0)
    margin.record_delay(0.05, now=0)
    margin.record_failure(now=10)

    assert margin.seconds(ADAPTIVE, 10) == 10
    assert margin.seconds(ADAPTIVE, 69.9) == 10
    assert margin.seconds(ADAPTIVE, 70) == pytest.approx(4.1)


def test_a_fixed_threshold_ignores_the_measured_delays() -> None:
    margin = AdaptiveMargin(interval=1.0)
    margin.record_delay(5.0, now=0)

    assert margin.seconds(POLICY, 0) == 10


def test_leases_already_waiting_come_due_by_the_margin_of_the_moment() -> None:
    lease = make_lease("q", policy=ADAPTIVE)
    book = book_of(lease)
    book.margin.record_delay(0.0, now=0)  # margin 4 s: due at 26
    assert not book.has_due(25)

    book.margin.record_delay(2.0, now=25)  # margin 8 s: due at 22, so due now

    (batch,) = book.due_batches(25)
    assert leases_of([batch]) == [lease]
