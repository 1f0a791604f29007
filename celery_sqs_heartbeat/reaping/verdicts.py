"""What a killed process left, judged from facts observed on SQS and SNS: reap or keep.

A process killed outright (SIGKILL, a lost machine) runs no clean-up
(:mod:`~celery_sqs_heartbeat.queues.exit_cleanup`), and neither SQS nor SNS says whether a
queue still has a consumer. The hard part is proving that an owner is gone; a queue of
a live process deleted under it breaks that process (a monitor polling a deleted queue,
a worker whose mailbox vanished answers no ``inspect`` or revoke, and SQS refuses its
name for a minute). So every rule below keeps a queue unless the facts prove its owner
gone, and says why in one line:

* **A monitor's event queue** (``celeryev-<uuid>``, subscribed to the ``celeryev``
  topic): a live monitor (``celery events``, Flower) receives continuously and deletes
  each event as it receives it (its consumer does not ack: kombu's SQS channel deletes
  at receipt), so an event in its queue is at most one poll old: the monitor's long poll
  returns as soon as an event arrives, and after an empty one it waits
  ``polling_interval``. An event that has sat unread for ``stale`` seconds, more than
  ``wait_time_seconds + polling_interval`` (checked at start, :func:`check_stale`),
  proves that nobody received from the queue for that long. Its age is SQS's
  ``SentTimestamp`` against SQS's own clock (the ``Date`` of its answer), so a skewed
  local clock misjudges nothing. The event is seen by a receive with a visibility
  timeout of 0: it stays visible, so a live monitor receives it as before, at most a
  moment later. That receive only counts in the message's ``ApproximateReceiveCount``,
  which matters only to a redrive policy: a queue with one is not looked into, and kept.
  An empty queue, or one whose events are all younger, is kept: with no worker sending
  events, dead and live monitors look alike, and nothing is claimed. The limit of the
  rule: a live monitor that has not received for ``stale`` seconds (stopped with
  Ctrl-Z, in a debugger, or more than ``stale`` seconds behind) is taken for gone.
  Counting messages (``ApproximateNumberOfMessages``) proves nothing alike: a live
  monitor of a busy fleet always has a few events waiting, and a dead one's count stays
  flat once its retention drops as many as arrive.
* **A worker's mailbox** (``<node>-celery-pidbox``, subscribed to the ``celery-pidbox``
  topic): gone when its node answered none of several ``ping`` broadcasts and the queue
  is older than ``older_than``. A queue not subscribed may be the mailbox of a live
  worker without remote control, which no ping reaches: kept. Without remote control
  in the reaper's own options no ping can be sent, and every mailbox is kept. The limit:
  a worker that cannot answer for the whole ping (a solo or gevent pool inside one long
  task, a worker restarting right then) is taken for gone.
* **A remote-control reply queue** (``<id>-reply-celery-pidbox``) is always kept. A live
  process keeps its reply queues between calls and deletes them itself
  (:mod:`~celery_sqs_heartbeat.monitoring.reply_queues`); between two calls the queue of
  a live Flower or of a script that asks every few minutes is empty and unread, exactly
  like a killed one's. Deleting a live one makes its next call fail on SQS for a minute
  (``QueueDeletedRecently``). Nothing observable tells them apart, and one left costs
  nothing but its name: it is subscribed to nothing and receives nothing.
* **A subscription** of either topic whose queue is a monitor's event queue or a mailbox
  (by name, after the queue name prefix): reaped when its queue is reaped now, or no
  longer exists. Others' subscriptions (any other queue, any other protocol) are left.

Task queues are never candidates: only names :mod:`..monitoring.pidbox_names` knows as a
monitor's or remote control's are. Pure, no I/O: the clock is SQS's, passed in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "EVENT_QUEUE",
    "MAILBOX",
    "REPLY_QUEUE",
    "SUBSCRIPTION",
    "EventQueueFacts",
    "MailboxFacts",
    "SubscriptionFacts",
    "Verdict",
    "check_stale",
    "judge_event_queue",
    "judge_mailbox",
    "judge_reply_queue",
    "judge_subscription",
    "parse_duration",
]

EVENT_QUEUE = "event-queue"
MAILBOX = "mailbox"
REPLY_QUEUE = "reply-queue"
SUBSCRIPTION = "subscription"


@dataclass(frozen=True)
class Verdict:
    """Reap ``name`` (a queue name, or a subscription's ARN) of ``kind``, or keep it, and why."""

    kind: str
    name: str
    reap: bool
    reason: str


@dataclass(frozen=True)
class EventQueueFacts:
    """A monitor's event queue as SQS showed it; times are SQS's, in epoch seconds."""

    name: str
    created: float
    #: SQS's clock when the queue was looked into.
    observed: float
    subscribed: bool
    has_redrive_policy: bool
    #: The ``SentTimestamp`` of the oldest event seen visible; None: none seen (or not looked).
    oldest_unread: float | None


@dataclass(frozen=True)
class MailboxFacts:
    """A worker's mailbox as SQS showed it, and whether its node answered a ping."""

    name: str
    created: float
    observed: float
    subscribed: bool
    answered: bool


@dataclass(frozen=True)
class SubscriptionFacts:
    """A subscription of the events' or remote control's topic to one of the app's queues."""

    arn: str
    topic: str
    queue: str
    queue_exists: bool


def judge_event_queue(queue: EventQueueFacts, older_than: float, stale: float) -> Verdict:
    """Reap a monitor's event queue only if an event in it went unread for ``stale`` seconds."""

    def keep(reason: str) -> Verdict:
        return Verdict(EVENT_QUEUE, queue.name, False, reason)

    age = queue.observed - queue.created
    if age < older_than:
        return keep(f"created {_span(age)} ago, less than {_span(older_than)}")
    if not queue.subscribed:
        return keep("not subscribed to the events' topic: it receives nothing")
    if queue.has_redrive_policy:
        return keep("it has a redrive policy: looking into it would count as a receive")
    if queue.oldest_unread is None:
        return keep("no event waiting: a live and a dead monitor look alike")
    unread = queue.observed - queue.oldest_unread
    if unread < stale:
        return keep(f"its oldest event is {_span(unread)} old: a monitor may be reading")
    return Verdict(
        EVENT_QUEUE, queue.name, True, f"an event unread for {_span(unread)}: no monitor reads it"
    )


def judge_mailbox(
    mailbox: MailboxFacts, older_than: float, remote_control: bool, pings: int
) -> Verdict:
    """Reap a worker's mailbox only if its node answered none of ``pings`` pings, and it is old."""

    def keep(reason: str) -> Verdict:
        return Verdict(MAILBOX, mailbox.name, False, reason)

    if not remote_control:
        return keep("remote control is off (supports_fanout): no ping can tell if its worker runs")
    if not mailbox.subscribed:
        return keep("not subscribed to remote control's topic: its worker may run without it")
    if mailbox.answered:
        return keep("its worker answered a ping")
    age = mailbox.observed - mailbox.created
    if age < older_than:
        return keep(f"created {_span(age)} ago, less than {_span(older_than)}")
    return Verdict(MAILBOX, mailbox.name, True, f"no worker of its name answered {pings} pings")


def judge_reply_queue(name: str) -> Verdict:
    """A reply queue is always kept: a live process's idle one looks like a killed one's."""
    return Verdict(REPLY_QUEUE, name, False, "a live process's kept reply queue looks the same")


def judge_subscription(subscription: SubscriptionFacts, reaped_queues: set[str]) -> Verdict:
    """Reap a subscription whose queue is reaped now, or is gone."""
    where = f"{subscription.topic} -> {subscription.queue}"
    if subscription.queue in reaped_queues:
        return Verdict(SUBSCRIPTION, subscription.arn, True, f"{where}: its queue is reaped")
    if not subscription.queue_exists:
        return Verdict(SUBSCRIPTION, subscription.arn, True, f"{where}: its queue is gone")
    return Verdict(SUBSCRIPTION, subscription.arn, False, f"{where}: its queue is kept")


def check_stale(stale: float, wait_time_seconds: float, polling_interval: float) -> None:
    """Refuse a ``stale`` a live monitor may reach between two polls: ValueError says why."""
    longest_gap = wait_time_seconds + polling_interval
    if stale <= longest_gap:
        raise ValueError(
            f"--stale {_span(stale)}: must be longer than wait_time_seconds + polling_interval "
            f"({_span(longest_gap)}), the longest a live monitor may leave an event unread"
        )


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``30m``, ``1h`` or ``2d``; ValueError otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 90s, 30m, 1h or 2d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _span(seconds: float) -> str:
    """``seconds`` as a person reads it: 45 s, 12 min, 3.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
