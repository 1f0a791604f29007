"""Remote control's queues are told apart by the names kombu's Mailbox gives them."""

from __future__ import annotations

import pytest
from kombu import Connection
from kombu.pidbox import Mailbox

from celery_sqs_heartbeat.monitoring.pidbox_names import is_event_queue, is_mailbox, is_reply_queue


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


def test_only_kombus_reply_queues_count_as_reply_queues() -> None:
    with Connection("memory://") as connection:
        reply_queue = Mailbox("celery", type="fanout")(connection).reply_queue.name
        mailbox = Mailbox("celery", type="fanout").get_queue("w1@host").name

    assert is_reply_queue(reply_queue), reply_queue
    assert not is_reply_queue(mailbox)
    assert not is_reply_queue("celeryev.5f0c2a5e")
    assert not is_reply_queue("reply.celery.pidbox")


@pytest.mark.parametrize(
    ("queue", "event_queue"),
    [
        ("celeryev.4f1e2d3c-aaaa-4bbb-8ccc-0123456789ab", True),
        ("celeryev-4f1e2d3c-aaaa-4bbb-8ccc-0123456789ab", True),
        # An event receiver given its own node id: its name comes back, not single use.
        ("celeryev.flower-1", False),
        ("celeryev-4f1e2d3c-aaaa-4bbb-8ccc-0123456789ab-reply-celery-pidbox", False),
        ("app-celeryev-4f1e2d3c-aaaa-4bbb-8ccc-0123456789ab", False),
        ("celery", False),
    ],
)
def test_a_monitors_event_queue_is_told_by_the_fresh_uuid_celery_names_it_with(
    queue: str, event_queue: bool
) -> None:
    assert is_event_queue(queue) is event_queue
