"""One pass of the reaper: the facts gathered in a safe order, judged, and acted on if asked.

The order matters where a process may start meanwhile. The pings go last, after every
queue was listed and read, so a worker that starts during the pass answers them rather
than being judged by a listing that missed it. A subscription is judged after the
queues, by ``GetQueueUrl`` (SQS's listing may lag behind a queue just made), and checked
once more right before it is removed: a worker restarted meanwhile under an old name
gets the same subscription back from SNS, and keeps it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from celery.events.event import EVENT_EXCHANGE_NAME

from ..monitoring.pidbox_names import is_event_queue, is_mailbox, is_reply_queue
from .observations import Observer, Queue, SubscriptionRow
from .verdicts import (
    EventQueueFacts,
    MailboxFacts,
    SubscriptionFacts,
    Verdict,
    judge_event_queue,
    judge_mailbox,
    judge_reply_queue,
    judge_subscription,
)

__all__ = ["Settings", "Survey"]


@dataclass(frozen=True)
class Settings:
    """The command's options, in seconds."""

    older_than: float
    stale: float
    ping_tries: int
    ping_timeout: float
    remote_control: bool
    mailbox_exchange: str


class Survey:
    """Judges the app's monitor queues, mailboxes and their subscriptions; reaps if told."""

    def __init__(self, observer: Observer, settings: Settings) -> None:
        self._observer = observer
        self._settings = settings
        self._queues: dict[str, Queue] = {}
        #: The queues deleted in this pass.
        self._deleted: set[str] = set()
        #: The queue of each subscription, by the subscription's ARN.
        self._subscribed_queue: dict[str, str] = {}

    def verdicts(self) -> list[Verdict]:
        """Every candidate judged: queues first, then the subscriptions of both topics."""
        queues = self._observer.queues()
        self._queues = {queue.name: queue for queue in queues}
        topics = {
            self._observer.sqs_name(EVENT_EXCHANGE_NAME): is_event_queue,
            self._observer.sqs_name(self._settings.mailbox_exchange): is_mailbox,
        }
        subscriptions = self._subscriptions(queues, topics)
        self._subscribed_queue = {row.arn: row.queue for row in subscriptions}
        subscribed = {row.queue for row in subscriptions}
        verdicts = [
            verdict
            for q in queues
            if is_event_queue(q.short_name)
            and (verdict := self._judge_event_queue(q, q.name in subscribed)) is not None
        ]
        verdicts += [judge_reply_queue(q.name) for q in queues if is_reply_queue(q.short_name)]
        verdicts += self._judge_mailboxes(
            [q for q in queues if is_mailbox(q.short_name)], subscribed
        )
        reaped = {v.name for v in verdicts if v.reap}
        verdicts += [
            judge_subscription(
                SubscriptionFacts(
                    row.arn, row.topic, row.queue, self._observer.queue_exists(row.queue)
                ),
                reaped,
            )
            for row in subscriptions
        ]
        return verdicts

    def _subscriptions(
        self, queues: list[Queue], topics: Mapping[str, Callable[[str], bool]]
    ) -> list[SubscriptionRow]:
        """Both topics' subscriptions of queues named as the topic's own (prefix removed)."""
        account = _account(queues)
        if account is None:
            return []
        prefix = self._observer.prefix
        return [
            row
            for topic, named_for_it in topics.items()
            for row in self._observer.subscriptions(topic, account)
            if row.queue.startswith(prefix) and named_for_it(row.queue[len(prefix) :])
        ]

    def _judge_event_queue(self, queue: Queue, subscribed: bool) -> Verdict | None:
        """The queue judged; None if it is gone since the listing."""
        read = self._observer.attributes(queue)
        if read is None:
            return None
        attributes, observed = read
        created = float(attributes.get("CreatedTimestamp", observed))
        redrive = "RedrivePolicy" in attributes
        old_enough = observed - created >= self._settings.older_than
        oldest_unread = None
        if old_enough and subscribed and not redrive:
            oldest_unread, observed = self._observer.oldest_unread(queue)
        facts = EventQueueFacts(queue.name, created, observed, subscribed, redrive, oldest_unread)
        return judge_event_queue(facts, self._settings.older_than, self._settings.stale)

    def _judge_mailboxes(self, mailboxes: list[Queue], subscribed: set[str]) -> list[Verdict]:
        settings = self._settings
        facts = []
        for queue in mailboxes:
            read = self._observer.attributes(queue)
            if read is not None:
                attributes, observed = read
                created = float(attributes.get("CreatedTimestamp", observed))
                facts.append((queue.name, created, observed))
        answering: set[str] = set()
        if settings.remote_control and facts:
            answering = self._observer.answering_mailboxes(
                settings.ping_tries, settings.ping_timeout
            )
        return [
            judge_mailbox(
                MailboxFacts(name, created, observed, name in subscribed, name in answering),
                settings.older_than,
                settings.remote_control,
                settings.ping_tries,
            )
            for name, created, observed in facts
        ]

    def reap(self, verdict: Verdict) -> bool:
        """Delete the queue, or remove the subscription; False if its queue exists after all.

        Queues go first (the verdicts come in that order). The queue of any other
        subscription is looked for once more (SQS may still show one deleted in this
        pass for a while: those are not asked about).
        """
        if verdict.name in self._queues:
            self._observer.delete_queue(self._queues[verdict.name])
            self._deleted.add(verdict.name)
            return True
        queue = self._subscribed_queue[verdict.name]
        if queue not in self._deleted and self._observer.queue_exists(queue):
            return False
        self._observer.unsubscribe(verdict.name)
        return True


def _account(queues: list[Queue]) -> str | None:
    """The account of the app's queues, from a URL (``.../ACCOUNT/name``); None if none."""
    for queue in queues:
        parts = queue.url.rsplit("/", 2)
        if len(parts) == 3:
            return parts[1]
    return None
