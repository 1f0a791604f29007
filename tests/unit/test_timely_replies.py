"""Which queues wait for their drain's timeout, and how long their long poll is."""

from __future__ import annotations

import pytest

from celery_sqs_heartbeat.timely_replies import is_mailbox, is_reply_queue, reply_wait_seconds


@pytest.mark.parametrize(
    ("queue", "reply", "mailbox"),
    [
        ("0b1c2d3e-aaaa.reply.celery.pidbox", True, False),
        ("0b1c2d3e-aaaa-reply-celery-pidbox", True, False),
        ("worker1@host.celery.pidbox", False, True),
        ("worker1@host-celery-pidbox", False, True),
        ("celeryev.4f1e", False, False),
        ("celery", False, False),
        ("replies", False, False),
    ],
)
def test_reply_queues_and_mailboxes_are_told_by_kombus_names(
    queue: str, reply: bool, mailbox: bool
) -> None:
    assert is_reply_queue(queue) is reply
    assert is_mailbox(queue) is mailbox


@pytest.mark.parametrize(
    ("wait", "timeout", "expected"),
    [
        (10, 1.0, 1),  # celery inspect's default timeout
        (10, 1.2, 2),  # rounded up: the drain never ends before its receive had its time
        (10, 0.1, 1),  # never 0, which kombu reads as "not given"
        (10, 12.0, 10),  # a longer timeout: the poll stays as configured
        (10, None, 10),  # no timeout: kombu's poll
        (0, 1.0, 0),  # short polling stays short
        (20, 5.0, 5),
    ],
)
def test_a_reply_queues_long_poll_ends_with_its_drain(
    wait: int, timeout: float | None, expected: int
) -> None:
    assert reply_wait_seconds(wait, timeout) == expected
