"""The outbox: when pending deletes and releases go out, in which calls, and what a failure does."""

from __future__ import annotations

import pytest

from celery_sqs_heartbeat.aws.sqs_facts import SQS_BATCH_SIZE
from celery_sqs_heartbeat.leasing.leases import EntryResult, Lease
from celery_sqs_heartbeat.leasing.outbox import (
    DELETED_MEMORY,
    EXPIRY_MARGIN,
    Outbox,
    OutboxBatch,
    Outgoing,
    Request,
)
from tests.unit.conftest import make_lease

RETRY = 1.0


def deletes(queue: str, count: int, prefix: str = "t") -> list[Outgoing]:
    return [
        Outgoing(make_lease(queue, task_id=f"{prefix}{i}"), Request.DELETE) for i in range(count)
    ]


def filled(items: list[Outgoing], due_at: float) -> Outbox:
    outbox = Outbox(retry_delay=RETRY)
    for item in items:
        outbox.add(item, due_at)
    return outbox


def answer(
    batch: OutboxBatch, result: EntryResult, reason: str = ""
) -> dict[Lease, tuple[EntryResult, str]]:
    return {item.lease: (result, reason) for item in batch.entries}


def test_nothing_goes_out_before_it_is_due() -> None:
    outbox = filled(deletes("q", 3), due_at=0.5)

    assert outbox.due_batches(0.49) == []
    assert outbox.next_due() == 0.5
    assert len(outbox) == 3


def test_once_one_entry_is_due_the_queue_s_others_go_along_in_one_call() -> None:
    early, *later = deletes("q", 4)
    outbox = Outbox(retry_delay=RETRY)
    outbox.add(early, 0.5)
    for item in later:
        outbox.add(item, 0.9)

    (batch,) = outbox.due_batches(0.5)

    assert batch.request is Request.DELETE
    assert list(batch.entries) == [early, *later]
    assert outbox.next_due() is None
    assert len(outbox) == 4  # on the wire until settled


def test_ten_waiting_make_a_full_call_at_once_and_the_rest_keep_waiting() -> None:
    items = deletes("q", 13)
    outbox = filled(items, due_at=0.5)

    assert outbox.next_due() == float("-inf")
    (batch,) = outbox.due_batches(0.0)

    assert list(batch.entries) == items[:10]
    assert outbox.next_due() == 0.5
    assert [list(b.entries) for b in outbox.due_batches(0.5)] == [items[10:]]


def test_a_delete_waits_while_its_lease_is_being_renewed() -> None:
    """Sent meanwhile, it could land first, and SQS would refuse the renewal."""
    items = deletes("q", 10)
    items[0].lease.renewing = True
    outbox = filled(items, due_at=0.5)

    assert outbox.next_due() == 0.5, "nine are not a full call"
    (batch,) = outbox.due_batches(0.5)
    assert [item.lease.task_id for item in batch.entries] == [f"t{i}" for i in range(1, 10)]
    assert outbox.next_due() is None, "nothing to wake for until the renewal is back"

    items[0].lease.renewing = False
    assert outbox.next_due() == 0.5
    (batch,) = outbox.due_batches(0.5)
    assert [item.lease.task_id for item in batch.entries] == ["t0"]


def test_calls_are_per_queue_and_per_kind_and_never_above_ten() -> None:
    first = deletes("q1", 23)
    second = deletes("q2", 2, prefix="b")
    releases = [Outgoing(make_lease("q1", task_id=f"r{i}"), Request.RELEASE, 5) for i in range(3)]
    outbox = filled([*first[:12], *second, *releases, *first[12:]], due_at=0)

    batches = outbox.due_batches(0)

    assert sorted((b.queue, b.request.value, len(b.entries)) for b in batches) == [
        ("q1", "delete", 3),
        ("q1", "delete", 10),
        ("q1", "delete", 10),
        ("q1", "release", 3),
        ("q2", "delete", 2),
    ]
    sent = [
        i for b in batches if b.queue == "q1" and b.request is Request.DELETE for i in b.entries
    ]
    assert sent == first


def test_confirmed_entries_are_done_and_leave_the_outbox() -> None:
    outbox = filled(deletes("q", 2), due_at=0)
    (batch,) = outbox.due_batches(0)

    settlement = outbox.settle(batch, answer(batch, EntryResult.OK), 0.1)

    assert settlement.done == list(batch.entries)
    assert len(outbox) == 0


def test_a_transient_failure_is_retried_after_the_retry_delay_while_the_lease_holds() -> None:
    (item,) = deletes("q", 1)  # received at 0, so its lease holds until 30
    outbox = filled([item], due_at=0)
    (batch,) = outbox.due_batches(0)

    settlement = outbox.settle(batch, answer(batch, EntryResult.TRANSIENT, "InternalError: x"), 0.2)

    assert settlement.retried == [(item, "InternalError: x")]
    assert outbox.due_batches(1.1) == []
    (again,) = outbox.due_batches(1.2)
    assert again.entries == (item,)
    assert item.attempts == 1


def test_a_renewed_lease_keeps_its_delete_retried() -> None:
    (item,) = deletes("q", 1)
    item.lease.expires_at = 60.0  # the manager renewed it meanwhile
    outbox = filled([item], due_at=40)
    (batch,) = outbox.due_batches(40)

    settlement = outbox.settle(batch, answer(batch, EntryResult.TRANSIENT), 40.5)

    assert [i for i, _ in settlement.retried] == [item]


def test_a_failure_after_the_lease_ran_out_is_abandoned() -> None:
    (item,) = deletes("q", 1)
    outbox = filled([item], due_at=29.5)
    (batch,) = outbox.due_batches(29.5)

    settlement = outbox.settle(
        batch, answer(batch, EntryResult.TRANSIENT, "ReadTimeoutError()"), 30
    )

    assert settlement.abandoned == [(item, "ReadTimeoutError()")]
    assert settlement.retried == []
    assert len(outbox) == 0


def test_an_invalid_receipt_handle_is_lost_and_never_retried() -> None:
    gone, fine = deletes("q", 2)
    outbox = filled([gone, fine], due_at=0)
    (batch,) = outbox.due_batches(0)

    settlement = outbox.settle(
        batch,
        {
            gone.lease: (EntryResult.LOST, "ReceiptHandleIsInvalid: x"),
            fine.lease: (EntryResult.OK, ""),
        },
        0.1,
    )

    assert settlement.lost == [(gone, "ReceiptHandleIsInvalid: x")]
    assert settlement.done == [fine]
    assert len(outbox) == 0


def test_a_release_refused_as_past_the_12_hours_goes_out_again_at_once_with_no_delay() -> None:
    """Better visible now than hidden by a decision SQS will not carry out."""
    release = Outgoing(make_lease("q"), Request.RELEASE, delay=600, reason="failure")
    outbox = filled([release], due_at=0)
    (batch,) = outbox.due_batches(0)

    settlement = outbox.settle(
        batch, answer(batch, EntryResult.BEYOND_LIMIT, "InvalidParameterValue: beyond"), 0.2
    )

    assert settlement.beyond_limit == [(release, "InvalidParameterValue: beyond")]
    assert settlement.lost == settlement.abandoned == settlement.retried == []
    assert settlement.ended() == []
    (again,) = outbox.due_batches(0.2)
    assert again.entries == (release,)
    assert release.delay == 0


def test_a_release_refused_as_past_the_12_hours_with_no_delay_is_given_up_not_lost() -> None:
    """The lease is over by SQS's clock: the message is visible again, or nearly."""
    release = Outgoing(make_lease("q"), Request.RELEASE, delay=0, reason="failure")
    outbox = filled([release], due_at=0)
    (batch,) = outbox.due_batches(0)

    settlement = outbox.settle(batch, answer(batch, EntryResult.BEYOND_LIMIT, "beyond"), 0.2)

    assert settlement.abandoned == [(release, "beyond")]
    assert settlement.lost == []
    assert len(outbox) == 0


def test_an_entry_missing_from_the_answer_counts_as_a_transient_failure() -> None:
    (item,) = deletes("q", 1)
    outbox = filled([item], due_at=0)
    (batch,) = outbox.due_batches(0)

    settlement = outbox.settle(batch, {}, 0.1)

    assert settlement.retried == [(item, "no answer")]


def test_hurrying_sends_everything_not_tried_yet_but_waits_for_retries() -> None:
    fresh = deletes("q", 2)
    (failed,) = deletes("q2", 1, prefix="f")
    outbox = filled([failed], due_at=0)
    (batch,) = outbox.due_batches(0)
    outbox.settle(batch, answer(batch, EntryResult.TRANSIENT), 0.1)  # retry at 1.1
    for item in fresh:
        outbox.add(item, 0.6)

    outbox.hurry(0.2)
    assert outbox.next_due() == 0.2
    (sent,) = outbox.due_batches(0.2)

    assert list(sent.entries) == fresh
    assert outbox.next_due() == 1.1


def received_again(item: Outgoing, handle: str, received_at: float) -> Lease:
    lease = make_lease(item.lease.queue, received_at=received_at, receipt_handle=handle)
    lease.message_id = item.lease.message_id
    return lease


def test_a_new_receive_of_a_message_being_deleted_takes_over_its_delete() -> None:
    (item,) = deletes("q", 1)
    item.lease.message_id = "m-1"
    outbox = filled([item], due_at=0.5)
    newer = received_again(item, "rh-newer", received_at=0.2)

    replaced = outbox.redirect_delete(newer, 0.2)

    assert replaced is not None and replaced.receipt_handle == "rh-t0"
    (batch,) = outbox.due_batches(0.5)
    assert [i.lease for i in batch.entries] == [newer]


def test_a_redirect_while_the_delete_is_on_the_wire_sends_it_again_by_the_new_receipt() -> None:
    (item,) = deletes("q", 1)
    item.lease.message_id = "m-1"
    old = item.lease
    outbox = filled([item], due_at=0)
    (batch,) = outbox.due_batches(0)
    newer = received_again(item, "rh-newer", received_at=0.1)
    outbox.redirect_delete(newer, 0.2)

    # SQS answered for the old receipt: a stale delete that did not delete.
    settlement = outbox.settle(batch, {old: (EntryResult.OK, "")}, 0.2)

    assert settlement.done == []
    (again,) = outbox.due_batches(0.2 + RETRY)
    assert [i.lease for i in again.entries] == [newer]


def test_a_receive_just_after_a_confirmed_delete_is_deleted_again_by_its_receipt() -> None:
    """The delete went by an older receipt (SQS: success, nothing deleted), and this
    worker's receive of the message came back after the delete's answer."""
    (confirmed,) = deletes("q", 1)
    confirmed.lease.message_id = "m-1"
    outbox = filled([confirmed], due_at=0)
    (batch,) = outbox.due_batches(0)
    outbox.settle(batch, answer(batch, EntryResult.OK), 0.1)
    newer = received_again(confirmed, "rh-newer", 0.2)

    replaced = outbox.redirect_delete(newer, 0.3)

    assert replaced is confirmed.lease
    (again,) = outbox.due_batches(0.3)
    assert [i.lease for i in again.entries] == [newer]


def test_a_confirmed_delete_is_forgotten_after_a_minute() -> None:
    first, second = deletes("q", 2)
    first.lease.message_id, second.lease.message_id = "m-1", "m-2"
    outbox = filled([first], due_at=0)
    (batch,) = outbox.due_batches(0)
    outbox.settle(batch, answer(batch, EntryResult.OK), 0.0)
    outbox.add(second, 1.0)
    (batch,) = outbox.due_batches(1.0)
    outbox.settle(batch, answer(batch, EntryResult.OK), 1.0)

    later = DELETED_MEMORY + 0.5
    assert outbox.redirect_delete(received_again(first, "rh-x", later), later) is None
    assert outbox.redirect_delete(received_again(second, "rh-y", later), later) is second.lease


@pytest.mark.parametrize("outcome", [EntryResult.LOST, EntryResult.TRANSIENT])
def test_a_delete_given_up_still_deletes_a_new_receive_of_its_message(
    outcome: EntryResult,
) -> None:
    """Issue 24: an ack in an outage longer than the lease could not be deleted; the
    message came back to this worker after the outage and ran again."""
    (item,) = deletes("q", 1)
    item.lease.message_id = "m-1"
    outbox = filled([item], due_at=0)
    (batch,) = outbox.due_batches(0)
    given_up_at = item.lease.expires_at + 1  # past its lease: a failure is not retried
    settlement = outbox.settle(batch, answer(batch, outcome), given_up_at)
    assert not settlement.retried and not settlement.done

    newer = received_again(item, "rh-after-the-outage", given_up_at + 5)
    assert outbox.redirect_delete(newer, given_up_at + 5) is item.lease
    (again,) = outbox.due_batches(given_up_at + 5)
    assert [i.lease for i in again.entries] == [newer]


def test_no_redirect_for_another_queue_or_a_message_never_deleted() -> None:
    (other,) = deletes("q", 1)
    other.lease.message_id = "m-2"
    outbox = filled([other], due_at=0)
    (batch,) = outbox.due_batches(0)
    outbox.settle(batch, answer(batch, EntryResult.OK), 0.1)

    elsewhere = make_lease("another-queue", receipt_handle="rh-y")
    elsewhere.message_id = "m-2"
    assert outbox.redirect_delete(elsewhere, 0.2) is None
    stranger = make_lease("q", receipt_handle="rh-z")
    stranger.message_id = "m-3"
    assert outbox.redirect_delete(stranger, 0.2) is None


def test_an_entry_never_waits_past_its_lease() -> None:
    """A capped or lost lease is not renewed: its delete must land before it runs out."""
    (capped,) = deletes("q", 1)  # received at 0: the lease runs out at 30
    outbox = Outbox(retry_delay=RETRY)

    outbox.add(capped, due_at=35.0)

    assert outbox.next_due() == 30.0 - EXPIRY_MARGIN


def test_a_limit_takes_that_many_calls_and_leaves_the_rest_due_in_order() -> None:
    items = deletes("q", 25)
    outbox = filled(items, due_at=0.5)

    first = outbox.due_batches(0.5, limit=2)

    assert [list(b.entries) for b in first] == [items[:10], items[10:20]]
    assert outbox.next_due() == 0.5  # the rest is still due: the caller comes back
    assert [list(b.entries) for b in outbox.due_batches(0.5, limit=2)] == [items[20:]]


def test_no_room_takes_nothing() -> None:
    outbox = filled(deletes("q", 3), due_at=0.0)

    assert outbox.due_batches(1.0, limit=0) == []
    assert len(outbox) == 3
    assert outbox.deletes_waiting() == 3


def test_a_settlement_lists_what_is_done_with() -> None:
    items = deletes("q", 3)
    outbox = filled(items, due_at=0.0)
    (batch,) = outbox.due_batches(0.0)
    done, lost, retried = items
    results = {
        done.lease: (EntryResult.OK, ""),
        lost.lease: (EntryResult.LOST, "ReceiptHandleIsInvalid"),
        retried.lease: (EntryResult.TRANSIENT, "InternalError"),
    }

    settlement = outbox.settle(batch, results, now=1.0)

    assert settlement.ended() == [done, lost]
    assert outbox.deletes_waiting() == 1


def tries_failing_until(outbox: Outbox, start: float, end: float, step: float = 0.01) -> int:
    """Calls made from ``start`` to ``end``, each answered at once with a failure."""
    tries, now = 0, start
    while now < end:
        for batch in outbox.due_batches(now):
            tries += 1
            outbox.settle(batch, answer(batch, EntryResult.TRANSIENT, "ConnectionError"), now)
        now += step
    return tries


def test_a_failing_delete_in_its_lease_s_last_second_is_not_retried_at_once() -> None:
    """Issue 33: the retry was capped at the lease's margin, already past: due at once."""
    (item,) = deletes("q", 1)  # received at 0, not renewed: its lease runs out at 30
    outbox = filled([item], due_at=29.0)

    tries = tries_failing_until(outbox, 29.0, 30.0)

    assert tries <= 3, f"{tries} tries in the last second"
    assert tries >= 2  # the first, and one more before the lease ends


def test_ten_failing_deletes_wait_for_their_retry_though_they_fill_a_call() -> None:
    """A full call is owed at once, but not one whose entries have just failed."""
    outbox = filled(deletes("q", SQS_BATCH_SIZE), due_at=5.0)

    tries = tries_failing_until(outbox, 5.0, 6.0)

    assert tries == 1, f"{tries} calls in one second, retry delay {RETRY} s"
