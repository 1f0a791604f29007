"""How long a reply queue's long poll is, and when a worker's mailbox is polled again at
once."""

from __future__ import annotations

import pytest
from freezegun import freeze_time

from celery_sqs_heartbeat.monitoring.timely_replies import (
    TimelyReplies,
    mailbox_polls_again_at_once,
    reply_wait_seconds,
)


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


@pytest.mark.parametrize(
    ("sent_at", "answered_at", "wait", "polling_interval", "at_once"),
    [
        (100.0, 110.0, 10, 1.0, True),  # a whole long poll, empty: no reason to wait more
        (100.0, 101.0, 1, 10.0, True),  # a whole 1-s poll: kombu's 10 s would add nothing
        (100.0, 101.0, 10, 1.0, True),  # out as long as kombu would have waited
        (100.0, 100.02, 10, 1.0, False),  # failed at once: kombu's wait, or it would spin
        (100.0, 100.5, 1, 10.0, False),  # back before its wait: not a whole long poll
        (100.0, 100.0, 0, 1.0, False),  # short polling (wait_time_seconds 0): kombu's pace
        (100.0, 100.0, 0, 0.0, False),  # short polling, no interval: kombu's pace still
        (None, 100.0, 10, 1.0, False),  # never sent, the channel may not consume: kombu's wait
    ],
)
def test_a_mailbox_polls_again_at_once_only_after_a_whole_long_poll(
    sent_at: float | None, answered_at: float, wait: int, polling_interval: float, at_once: bool
) -> None:
    assert mailbox_polls_again_at_once(sent_at, answered_at, wait, polling_interval) is at_once


class Port:
    """What timely replies read of a channel: its hub and its long poll."""

    wait_time_seconds = 10

    def __init__(self) -> None:
        self.hub = self
        self.soon: list[str] = []

    def call_soon(self, callback: object, queue: str) -> None:
        self.soon.append(queue)

    def _schedule_queue(self, queue: str) -> None:
        raise AssertionError("only scheduled through the hub")


def test_a_reply_queues_blocking_receive_waits_no_longer_than_the_drain_it_serves() -> None:
    part = TimelyReplies(Port(), lambda: 1.0)
    reply, jobs = "0b0f.reply.celery.pidbox", "jobs"

    waits = part.drain(1.0, lambda: (part.wait_for(reply, None), part.wait_for(jobs, None)))

    assert waits == (1, None)
    assert part.wait_for(reply, None) == 10  # no drain running: kombu's wait


def test_a_mailbox_whose_empty_poll_was_out_for_its_wait_is_polled_again_at_once() -> None:
    port, kombus = Port(), list[str]()
    part = TimelyReplies(port, lambda: 1.0)
    mailbox = "worker1.celery.pidbox"
    with freeze_time("2026-01-01 00:00:00") as frozen:
        part.poll_sent(mailbox)
        frozen.tick(10)
        part.next_turn(mailbox, None, lambda: kombus.append(mailbox))
        part.next_turn("jobs", None, lambda: kombus.append("jobs"))  # never timed

    assert port.soon == [mailbox] and kombus == ["jobs"]
