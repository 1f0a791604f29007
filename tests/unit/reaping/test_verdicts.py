"""What the reaper takes for a killed process's leftovers, given what SQS showed and its clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from celery_sqs_heartbeat.reaping.verdicts import (
    EventQueueFacts,
    MailboxFacts,
    SubscriptionFacts,
    check_stale,
    judge_event_queue,
    judge_mailbox,
    judge_reply_queue,
    judge_subscription,
    parse_duration,
)

NOW = 1_800_000_000.0
HOUR = 3600.0
STALE = 30.0


#: A monitor's queue two hours old, subscribed, its oldest event unread for 45 s.
EVENT_QUEUE = EventQueueFacts(
    name="app-celeryev-1",
    created=NOW - 2 * HOUR,
    observed=NOW,
    subscribed=True,
    has_redrive_policy=False,
    oldest_unread=NOW - 45,
)


def test_an_event_unread_for_longer_than_stale_shows_the_monitor_gone() -> None:
    verdict = judge_event_queue(EVENT_QUEUE, older_than=HOUR, stale=STALE)

    assert verdict.reap, verdict
    assert verdict.reason == "an event unread for 45 s: no monitor reads it"


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        # A live monitor takes each event within a poll: its oldest is seconds old.
        ({"oldest_unread": NOW - 3}, "its oldest event is 3 s old"),
        ({"oldest_unread": NOW - STALE + 1}, "its oldest event is 29 s old"),
        # No worker sends events: a live and a dead monitor both have an empty queue.
        ({"oldest_unread": None}, "no event waiting"),
        ({"created": NOW - HOUR + 60}, "created 59 min ago, less than 60 min"),
        ({"subscribed": False}, "not subscribed"),
        ({"has_redrive_policy": True}, "redrive policy"),
    ],
)
def test_an_event_queue_is_kept_unless_an_old_event_proves_nobody_reads_it(
    facts: dict[str, object], why: str
) -> None:
    verdict = judge_event_queue(replace(EVENT_QUEUE, **facts), older_than=HOUR, stale=STALE)

    assert not verdict.reap, verdict
    assert why in verdict.reason, verdict


def test_an_event_exactly_stale_is_enough() -> None:
    assert judge_event_queue(replace(EVENT_QUEUE, oldest_unread=NOW - STALE), HOUR, STALE).reap


#: A worker's mailbox two hours old, subscribed, its node silent to every ping.
MAILBOX = MailboxFacts(
    name="app-w1_host-celery-pidbox",
    created=NOW - 2 * HOUR,
    observed=NOW,
    subscribed=True,
    answered=False,
)


def test_a_mailbox_whose_node_answered_no_ping_and_is_old_goes() -> None:
    verdict = judge_mailbox(MAILBOX, older_than=HOUR, remote_control=True, pings=3)

    assert verdict.reap, verdict
    assert verdict.reason == "no worker of its name answered 3 pings"


@pytest.mark.parametrize(
    ("facts", "remote_control", "why"),
    [
        ({"answered": True}, True, "answered a ping"),
        ({"created": NOW - 60}, True, "created 60 s ago"),
        # A worker without remote control has a mailbox no ping reaches.
        ({"subscribed": False}, True, "not subscribed"),
        # The reaper itself cannot ping: nothing can be told.
        ({}, False, "remote control is off"),
    ],
)
def test_a_mailbox_is_kept_unless_its_worker_is_shown_gone(
    facts: dict[str, object], remote_control: bool, why: str
) -> None:
    verdict = judge_mailbox(replace(MAILBOX, **facts), HOUR, remote_control, pings=3)

    assert not verdict.reap, verdict
    assert why in verdict.reason, verdict


def test_a_reply_queue_is_always_kept() -> None:
    assert not judge_reply_queue("app-1-reply-celery-pidbox").reap


@pytest.mark.parametrize(
    ("exists", "reaped", "reap", "why"),
    [
        (False, set(), True, "its queue is gone"),
        (True, {"q"}, True, "its queue is reaped"),
        (True, set(), False, "its queue is kept"),
    ],
)
def test_a_subscription_goes_with_its_queue(
    exists: bool, reaped: set[str], reap: bool, why: str
) -> None:
    verdict = judge_subscription(SubscriptionFacts("arn:sub", "app-celeryev", "q", exists), reaped)

    assert (verdict.reap, verdict.reason) == (reap, f"app-celeryev -> q: {why}")


def test_stale_must_outlast_a_live_monitors_longest_wait_between_polls() -> None:
    check_stale(21.5, wait_time_seconds=20, polling_interval=1)
    with pytest.raises(ValueError, match=r"--stale 21 s: must be longer than .* \(21 s\)"):
        check_stale(21, wait_time_seconds=20, polling_interval=1)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("30m", 1800),
        ("1h", 3600),
        ("1.5h", 5400),
        ("2d", 172800),
        ("0s", 0),
    ],
)
def test_durations_read_as_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1w", "-1h", "1 hour"])
def test_other_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)
