"""The publish book: which messages share a SendMessageBatch call, when, and after a failure."""

from __future__ import annotations

from celery_sqs_heartbeat.aws.sqs_facts import SQS_MAX_BATCH_SEND_SIZE
from celery_sqs_heartbeat.payloads.pointers import S3Pointer
from celery_sqs_heartbeat.publishing.book import (
    MAX_ATTEMPTS,
    RETRY_FIRST_DELAY,
    RETRY_MAX_DELAY,
    PublishBatch,
    PublishBook,
    SendOutcome,
    Unsent,
    retry_delay,
)

WAIT = 0.05
KIB = 1024


def message(task_id: str, target: str = "q", size: int = 100, group: str | None = None) -> Unsent:
    return Unsent(task_id, target, {"MessageBody": task_id}, size, group, queue=target)


def book_of(*items: Unsent, now: float = 0.0) -> PublishBook:
    book = PublishBook(batch_wait=WAIT)
    for item in items:
        book.add(item, now)
    return book


def ids(batch: PublishBatch | None) -> list[str]:
    assert batch is not None
    return [item.task_id for item in batch.entries]


def answer(batch: PublishBatch, outcome: SendOutcome, reason: str = "") -> dict[int, tuple]:
    return dict.fromkeys(range(len(batch.entries)), (outcome, reason))


def test_a_lone_message_waits_for_company_until_the_batch_wait_ends() -> None:
    book = book_of(message("a"))
    assert book.take_batch(0.0) is None
    assert book.next_wake(0.0) == WAIT
    assert ids(book.take_batch(WAIT)) == ["a"]
    assert book.waiting() == 0 and len(book) == 1


def test_ten_messages_make_a_full_call_at_once_in_publication_order() -> None:
    book = book_of(*(message(f"m{i}") for i in range(13)))
    assert book.next_wake(0.0) == 0.0
    assert ids(book.take_batch(0.0)) == [f"m{i}" for i in range(10)]
    assert book.take_batch(0.0) is None
    assert ids(book.take_batch(WAIT)) == ["m10", "m11", "m12"]


def test_adding_tells_a_sender_to_look_when_a_call_may_be_full_or_the_book_was_empty() -> None:
    book = PublishBook(batch_wait=WAIT)
    looks = [book.add(message(f"m{i}"), 0.0) for i in range(10)]
    assert looks == [True] + [False] * 8 + [True]


def test_calls_are_per_target() -> None:
    book = book_of(message("a1", "qa"), message("b1", "qb"), message("a2", "qa"))
    assert ids(book.take_batch(WAIT)) == ["a1", "a2"]
    assert ids(book.take_batch(WAIT)) == ["b1"]


def test_a_call_holds_a_megabyte_at_most_and_a_message_that_does_not_fit_makes_it_full() -> None:
    big = SQS_MAX_BATCH_SEND_SIZE // 2
    book = book_of(message("a", size=big), message("b", size=big), message("c", size=big))
    assert ids(book.take_batch(0.0)) == ["a", "b"]
    assert book.take_batch(0.0) is None
    assert ids(book.take_batch(WAIT)) == ["c"]


def test_a_standard_queue_fills_a_call_with_later_small_messages_around_a_large_one() -> None:
    book = book_of(
        message("large1", size=900 * KIB),
        message("large2", size=900 * KIB),
        message("small", size=KIB),
    )
    assert ids(book.take_batch(0.0)) == ["large1", "small"]


def test_a_message_larger_than_a_call_still_goes_alone_for_sqs_to_answer() -> None:
    book = book_of(message("huge", size=SQS_MAX_BATCH_SEND_SIZE + 1), message("small"))
    assert ids(book.take_batch(0.0)) == ["huge"]


def test_a_fifo_group_is_never_in_two_calls_on_the_wire() -> None:
    book = book_of(*(message(f"a{i}", group="A") for i in range(12)), message("b0", group="B"))
    first = book.take_batch(0.0)
    assert ids(first) == [f"a{i}" for i in range(10)]
    # a10 and a11 wait for the first call; b0 may go beside it.
    assert ids(book.take_batch(WAIT)) == ["b0"]
    assert book.take_batch(WAIT) is None
    assert book.next_wake(WAIT) is None
    assert first is not None
    book.settle(first, answer(first, SendOutcome.SENT), WAIT)
    assert ids(book.take_batch(WAIT)) == ["a10", "a11"]


def test_a_fifo_message_never_overtakes_an_earlier_one_of_its_group() -> None:
    big = 900 * KIB
    book = book_of(
        message("a1", size=big, group="A"),
        message("a2", size=big, group="A"),
        message("a3", size=KIB, group="A"),
        message("b1", size=KIB, group="B"),
    )
    assert ids(book.take_batch(0.0)) == ["a1", "b1"]


def test_sent_entries_leave_the_book() -> None:
    book = book_of(message("a"), message("b"))
    batch = book.take_batch(WAIT)
    assert batch is not None
    settlement = book.settle(batch, answer(batch, SendOutcome.SENT), WAIT)
    assert [item.task_id for item in settlement.sent] == ["a", "b"]
    assert len(book) == 0 and book.take_batch(10.0) is None


def test_an_entry_to_retry_goes_back_in_its_place_after_a_doubling_capped_backoff() -> None:
    book = book_of(message("a"), message("b"), message("c"))
    batch = book.take_batch(WAIT)
    assert batch is not None
    results = {0: (SendOutcome.SENT, ""), 1: (SendOutcome.RETRY, "InternalError: oops")}
    # "c" got no answer at all: retried too.
    settlement = book.settle(batch, results, 1.0)
    assert [(item.task_id, why) for item, why in settlement.retried] == [
        ("b", "InternalError: oops"),
        ("c", "no answer"),
    ]
    assert book.take_batch(1.0) is None
    assert book.next_wake(1.0) == 1.0 + RETRY_FIRST_DELAY
    assert ids(book.take_batch(1.0 + RETRY_FIRST_DELAY)) == ["b", "c"]
    assert [retry_delay(n) for n in range(1, 4)] == [0.1, 0.2, 0.4]
    assert retry_delay(MAX_ATTEMPTS) == RETRY_MAX_DELAY


def test_a_fifo_retry_holds_back_the_later_messages_of_its_group_only() -> None:
    book = book_of(message("a1", group="A"), message("a2", group="A"), message("b1", group="B"))
    batch = book.take_batch(WAIT)
    assert ids(batch) == ["a1", "a2", "b1"]
    assert batch is not None
    book.settle(batch, answer(batch, SendOutcome.SENT) | {0: (SendOutcome.RETRY, "x")}, 1.0)
    book.add(message("a3", group="A"), 1.0)
    book.add(message("b2", group="B"), 1.0)
    book.hurry(1.0)
    assert ids(book.take_batch(1.0)) == ["b2"]
    assert ids(book.take_batch(1.0 + RETRY_FIRST_DELAY)) == ["a1", "a3"]


def test_a_refused_entry_is_given_up_at_once_and_a_failing_one_after_its_last_try() -> None:
    book = book_of(message("refused"), message("failing"))
    now = WAIT
    batch = book.take_batch(now)
    assert batch is not None
    results = {0: (SendOutcome.REFUSED, "InvalidMessageContents: no"), 1: (SendOutcome.RETRY, "t")}
    settlement = book.settle(batch, results, now)
    given_up = [(item.task_id, why) for item, why in settlement.given_up]
    assert given_up == [("refused", "InvalidMessageContents: no")]
    for _ in range(MAX_ATTEMPTS - 1):
        now += RETRY_MAX_DELAY
        batch = book.take_batch(now)
        assert ids(batch) == ["failing"]
        assert batch is not None
        settlement = book.settle(batch, answer(batch, SendOutcome.RETRY, "Throttling"), now)
    assert [(item.task_id, why) for item, why in settlement.given_up] == [("failing", "Throttling")]
    assert len(book) == 0


def offloaded(task_id: str) -> Unsent:
    item = message(task_id)
    item.put_object = (S3Pointer("bucket", f"key-{task_id}"), None)
    return item


def test_the_objects_of_entries_given_up_unsent_are_orphans_those_sent_are_not() -> None:
    book = book_of(offloaded("refused"), offloaded("sent"), message("small"), offloaded("later"))
    batch = book.take_batch(WAIT)
    assert batch is not None
    results = {
        0: (SendOutcome.REFUSED, "InvalidMessageContents: no"),
        1: (SendOutcome.SENT, ""),
        2: (SendOutcome.REFUSED, "InvalidMessageContents: no"),
        3: (SendOutcome.RETRY, "InternalError: no"),
    }
    settlement = book.settle(batch, results, WAIT)
    assert settlement.orphaned_objects() == [(S3Pointer("bucket", "key-refused"), None)]


def test_an_entry_that_once_got_no_answer_keeps_its_object_whatever_comes_after() -> None:
    """SQS may hold that message: its object is all a worker will have of its body."""
    book = book_of(offloaded("a"), offloaded("b"))
    now = WAIT
    batch = book.take_batch(now)
    assert batch is not None
    # "b" has no answer at all: the book counts it as unanswered too.
    settlement = book.settle(batch, {0: (SendOutcome.UNANSWERED, "ReadTimeoutError")}, now)
    assert [item.task_id for item, _ in settlement.retried] == ["a", "b"]
    for _ in range(MAX_ATTEMPTS - 1):
        now += RETRY_MAX_DELAY
        batch = book.take_batch(now)
        assert batch is not None
        settlement = book.settle(batch, answer(batch, SendOutcome.RETRY, "InternalError"), now)
    assert [item.task_id for item, _ in settlement.given_up] == ["a", "b"]
    assert settlement.orphaned_objects() == []


def test_hurry_makes_every_waiting_message_due_but_keeps_a_backoff() -> None:
    book = book_of(message("a"), message("b", target="other"))
    book.hurry(0.0)
    assert ids(book.take_batch(0.0)) == ["a"]
    assert ids(book.take_batch(0.0)) == ["b"]


def test_bytes_waiting_count_what_is_not_on_the_wire() -> None:
    book = book_of(message("a", size=10), message("b", size=20))
    assert book.bytes_waiting() == 30
    batch = book.take_batch(WAIT)
    assert batch is not None and book.bytes_waiting() == 0
    book.settle(batch, {0: (SendOutcome.RETRY, "x"), 1: (SendOutcome.SENT, "")}, WAIT)
    assert book.bytes_waiting() == 10


def test_a_fifo_group_keeps_its_order_whichever_producer_s_client_sends_it() -> None:
    """Issue 31, 4: Celery's producer pool hands one thread different producers, each
    with a client of its own; the group's order is the queue's all the same."""
    first = Unsent("m1", "producer1", {"MessageBody": "m1"}, 100, "A", queue="q")
    later = [
        Unsent(f"m{n}", "producer2", {"MessageBody": "x"}, 100, "A", queue="q") for n in (2, 3, 4)
    ]
    book = book_of(first, *later)
    batch = book.take_batch(WAIT)
    assert ids(batch) == ["m1"]
    assert book.take_batch(WAIT) is None  # the group is on the wire, through producer1
    assert batch is not None
    book.settle(batch, answer(batch, SendOutcome.RETRY, "InternalError"), 1.0)
    assert book.take_batch(1.0) is None  # m1 waits for its retry, and m2 to m4 behind it
    assert book.next_wake(1.0) == 1.0 + RETRY_FIRST_DELAY
    again = book.take_batch(1.0 + RETRY_FIRST_DELAY)
    assert ids(again) == ["m1"]
    assert again is not None
    book.settle(again, answer(again, SendOutcome.SENT), 2.0)
    assert ids(book.take_batch(2.0)) == ["m2", "m3", "m4"]


def test_a_call_holds_no_more_than_its_queue_s_maximum_message_size() -> None:
    """Issue 31, 5: nine small messages and one over a 256 KiB queue's limit: the large
    one goes alone, for SQS to refuse alone, and takes no other message down."""
    limit = 256 * KIB
    small = [message(f"s{n}", size=KIB) for n in range(9)]
    large = message("large", size=270_000)
    for item in (*small, large):
        item.call_limit = limit
    book = book_of(*small[:4], large, *small[4:])
    book.hurry(0.0)
    assert ids(book.take_batch(0.0)) == [f"s{n}" for n in range(9)]
    assert ids(book.take_batch(0.0)) == ["large"]
