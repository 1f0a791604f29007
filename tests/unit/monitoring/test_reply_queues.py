"""Reply queues are kept between calls, and go once long idle or at the exit."""

from __future__ import annotations

from celery_sqs_heartbeat.monitoring.reply_queues import REPLY_QUEUE_IDLE_SECONDS, ReplyQueueBook

PARENT, CHILD = 100, 101


def nothing() -> None:
    """A delete that the test does not call."""


def test_a_reply_queue_used_again_before_its_idle_time_is_kept() -> None:
    book = ReplyQueueBook()
    book.used("url-a", nothing, PARENT, now=0.0)
    book.used("url-a", nothing, PARENT, now=REPLY_QUEUE_IDLE_SECONDS - 1)

    assert book.take_idle(PARENT, now=REPLY_QUEUE_IDLE_SECONDS + 1) == {}
    assert list(book.take_all(PARENT)) == ["url-a"]


def test_a_reply_queue_idle_for_its_idle_time_goes_once() -> None:
    book = ReplyQueueBook(idle_seconds=300)
    book.used("url-a", nothing, PARENT, now=0.0)
    book.used("url-b", nothing, PARENT, now=10.0)

    assert list(book.take_idle(PARENT, now=305.0)) == ["url-a"]
    assert book.take_idle(PARENT, now=305.0) == {}
    assert list(book.take_all(PARENT)) == ["url-b"]
    assert book.take_all(PARENT) == {}


def test_a_child_takes_none_of_its_parents_reply_queues() -> None:
    book = ReplyQueueBook(idle_seconds=300)
    book.used("url-a", nothing, PARENT, now=0.0)

    assert book.take_idle(CHILD, now=1000.0) == {}
    assert book.take_all(CHILD) == {}
    assert list(book.take_all(PARENT)) == ["url-a"]
