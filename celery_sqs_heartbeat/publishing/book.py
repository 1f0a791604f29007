"""Messages waiting to be sent in SendMessageBatch calls: pure bookkeeping, time passed in.

SQS takes up to ten messages, a megabyte in all, in one ``SendMessageBatch``, and bills
per request. Inside a batch-publishing scope
(:func:`~celery_sqs_heartbeat.publishing.scope.publishing_in_batches`) a publish only
leaves its message here, and the scope's sending threads take calls out:

- by target (a client and a queue URL: the ones kombu's ``_put`` chose), in the order
  the messages were published;
- a call goes as soon as it is full (ten entries, or the next one would not fit in the
  queue's ``MaximumMessageSize``, a megabyte at most), or once its oldest entry has
  waited ``batch_wait``, or at once when the scope ends (:meth:`PublishBook.hurry`);
- on a FIFO queue no two calls on the wire carry the same message group, and an entry
  of a group never overtakes an earlier one that waits (for a retry, or for room in a
  call): SQS keeps the order of one call's entries, so a group's order is kept. Both
  rules are the queue's (its URL), whatever the client: Celery's producer pool hands
  one thread different producers, each channel with a client of its own;
- an entry SQS did not take for a reason worth another try (throttling, its own fault,
  no answer) goes back in its place, to be tried again after a backoff that doubles
  from :data:`RETRY_FIRST_DELAY` up to :data:`RETRY_MAX_DELAY`, :data:`MAX_ATTEMPTS`
  times in all; then it is given up, as is one SQS refused for good;
- an entry given up whose every try SQS answered (or that never reached it) is surely
  not in SQS: the S3 object put for its body has no message pointing at it
  (:meth:`PublishSettlement.orphaned_objects`).

Like :mod:`celery_sqs_heartbeat.leasing.outbox`, whose model this follows, nothing here is
thread-safe or does I/O: the publisher holds its lock around every call and makes the
SQS calls outside it.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..aws.sqs_facts import SQS_BATCH_SIZE, SQS_MAX_BATCH_SEND_SIZE

if TYPE_CHECKING:
    from ..payloads.cleanup import Owned

#: A FIFO message group of one queue: (queue URL, MessageGroupId).
GroupKey = tuple[str, str]

__all__ = [
    "MAX_ATTEMPTS",
    "PublishBatch",
    "PublishBook",
    "PublishSettlement",
    "SendOutcome",
    "Unsent",
    "retry_delay",
]

#: The first retry's wait, in seconds; each further one waits twice as long.
RETRY_FIRST_DELAY = 0.1
#: The longest wait between two tries of one entry: SQS's throttling wants a backoff,
#: but a scope's end waits for it, so it stays a few seconds.
RETRY_MAX_DELAY = 5.0
#: Tries of one entry before it is given up: about 21 s of retries in all
#: (0.1 + 0.2 + ... + 3.2, then 5 s three times), longer than SQS's usual throttling
#: and a blip of its front end, short enough for a scope's end to report the failure.
MAX_ATTEMPTS = 10


class SendOutcome(Enum):
    """What came of one entry of a SendMessageBatch call."""

    SENT = "sent"
    #: Not taken now, worth another try: throttled, SQS's own fault, never sent.
    RETRY = "retry"
    #: No answer (a timeout, a broken connection): worth another try, and SQS may
    #: have taken the message meanwhile.
    UNANSWERED = "unanswered"
    #: Refused for good: sending the same message again would be refused again.
    REFUSED = "refused"

    @property
    def worth_another_try(self) -> bool:
        return self in (SendOutcome.RETRY, SendOutcome.UNANSWERED)


@dataclass(eq=False)
class Unsent:
    """One published message on its way to SQS."""

    #: The Celery task id, to name the message to whoever published it.
    task_id: str
    #: Where it goes: the client and queue URL kombu chose, as one hashable key.
    target: Hashable
    #: Its SendMessageBatch entry, less ``Id``: body, attributes, FIFO ids, delay.
    entry: dict[str, Any]
    #: Bytes SQS counts against a call's limit: body and attributes.
    size: int
    #: Its FIFO message group, None on a standard queue.
    group: str | None = None
    #: Its queue's URL: a FIFO group's order is the queue's, whichever client sends.
    queue: str = field(kw_only=True)
    #: Bytes a call to its queue may carry: the queue's ``MaximumMessageSize``.
    call_limit: int = field(default=SQS_MAX_BATCH_SEND_SIZE, kw_only=True)
    #: Publication order, set by the book.
    order: int = 0
    #: When it should go out at the latest, on the caller's clock.
    due_at: float = 0.0
    #: Not before this time: the backoff after a failed try.
    not_before: float = 0.0
    attempts: int = 0
    #: The S3 object its body was put in, if it was too large for SQS.
    put_object: Owned | None = field(default=None, kw_only=True)
    #: Some try got no answer: SQS may hold the message, whatever came of later tries.
    maybe_sent: bool = False


@dataclass(frozen=True)
class PublishBatch:
    """One SendMessageBatch call: up to ten entries for one target, within its size limit."""

    target: Hashable
    entries: tuple[Unsent, ...]


@dataclass
class PublishSettlement:
    """What came of a call, for the publisher to tell its scopes."""

    sent: list[Unsent] = field(default_factory=list)
    #: Not taken, and put back for another try: with SQS's reason.
    retried: list[tuple[Unsent, str]] = field(default_factory=list)
    #: Refused for good, or still failing after :data:`MAX_ATTEMPTS` tries.
    given_up: list[tuple[Unsent, str]] = field(default_factory=list)

    def orphaned_objects(self) -> list[Owned]:
        """The S3 objects of the entries given up that SQS surely does not hold.

        No message will ever point at them: each is to be deleted now, or it stays
        until the bucket's lifecycle rule. One whose entry once got no answer is kept:
        SQS may hold that message, which needs its object.
        """
        return [
            item.put_object
            for item, _ in self.given_up
            if item.put_object is not None and not item.maybe_sent
        ]


def retry_delay(attempts: int) -> float:
    """The wait before the next try of an entry that failed ``attempts`` times."""
    return float(min(RETRY_MAX_DELAY, RETRY_FIRST_DELAY * 2 ** (attempts - 1)))


class PublishBook:
    """Messages waiting per target, in publication order, and the FIFO groups on the wire."""

    def __init__(self, batch_wait: float) -> None:
        self.batch_wait = batch_wait
        self._waiting: dict[Hashable, list[Unsent]] = {}
        self._in_flight = 0
        self._bytes_waiting = 0
        self._published = 0
        #: Every FIFO group some call on the wire carries.
        self._groups_on_the_wire: set[GroupKey] = set()

    def __len__(self) -> int:
        """Entries waiting or on the wire."""
        return self.waiting() + self._in_flight

    def __iter__(self) -> Iterator[Unsent]:
        for items in self._waiting.values():
            yield from items

    def waiting(self) -> int:
        """Entries not on the wire."""
        return sum(len(items) for items in self._waiting.values())

    def bytes_waiting(self) -> int:
        return self._bytes_waiting

    def add(self, item: Unsent, now: float) -> bool:
        """Keep ``item`` until its call; True if a sending thread should look now.

        That is when a call of its target may be full, or nothing else was waiting (a
        sleeping thread then has no deadline to wake at).
        """
        was_empty = not self._waiting
        self._published += 1
        item.order = self._published
        item.due_at = now + self.batch_wait
        items = self._waiting.setdefault(item.target, [])
        items.append(item)
        self._bytes_waiting += item.size
        return was_empty or len(items) >= SQS_BATCH_SIZE

    def hurry(self, now: float) -> None:
        """Make every waiting entry due now: a scope ends. A backoff still holds."""
        for item in self:
            item.due_at = min(item.due_at, now)

    def take_batch(self, now: float) -> PublishBatch | None:
        """The next call to make now, its entries on the wire until settled; or None."""
        heads = self._group_heads()
        for target in list(self._waiting):
            entries, full = self._pack(target, now, heads)
            if entries and (full or any(item.due_at <= now for item in entries)):
                self._take(target, entries)
                return PublishBatch(target, tuple(entries))
        return None

    def next_wake(self, now: float) -> float | None:
        """When a call may be owed next; None if only a settlement can make one.

        A FIFO entry whose group is on the wire waits for that call's settlement, which
        wakes the sending threads anyway.
        """
        wakes: list[float] = []
        heads = self._group_heads()
        for target, items in self._waiting.items():
            entries, full = self._pack(target, now, heads)
            if full:
                return now
            wakes.extend(item.due_at for item in entries)
            wakes.extend(item.not_before for item in items if item.not_before > now)
        return min(wakes, default=None)

    def settle(
        self, batch: PublishBatch, results: Mapping[int, tuple[SendOutcome, str]], now: float
    ) -> PublishSettlement:
        """Apply SQS's answer to ``batch`` (by entry index); ``now`` is when it arrived.

        An entry with no answer counts as one worth another try, that SQS may have taken.
        """
        settlement = PublishSettlement()
        self._in_flight -= len(batch.entries)
        for index, item in enumerate(batch.entries):
            if item.group is not None:
                self._groups_on_the_wire.discard((item.queue, item.group))
            item.attempts += 1
            outcome, reason = results.get(index, (SendOutcome.UNANSWERED, "no answer"))
            item.maybe_sent = item.maybe_sent or outcome is SendOutcome.UNANSWERED
            if outcome is SendOutcome.SENT:
                settlement.sent.append(item)
            elif outcome.worth_another_try and item.attempts < MAX_ATTEMPTS:
                item.not_before = item.due_at = now + retry_delay(item.attempts)
                self._put_back(item)
                settlement.retried.append((item, reason))
            else:
                settlement.given_up.append((item, reason))
        return settlement

    def _group_heads(self) -> dict[GroupKey, dict[Hashable, int]]:
        """Per FIFO group, the order of its earliest waiting entry in each target."""
        heads: dict[GroupKey, dict[Hashable, int]] = {}
        for target, items in self._waiting.items():
            for item in items:
                if item.group is not None:
                    heads.setdefault((item.queue, item.group), {}).setdefault(target, item.order)
        return heads

    def _pack(
        self, target: Hashable, now: float, heads: dict[GroupKey, dict[Hashable, int]]
    ) -> tuple[list[Unsent], bool]:
        """The entries a call to ``target`` would carry now, and whether it is full.

        In publication order, first fit under the queue's limit; a FIFO entry never
        goes ahead of an earlier one of its group that stays behind, here or waiting
        for another target (another producer's client) of its queue.
        """
        entries: list[Unsent] = []
        size = 0
        full = False
        held_groups: set[GroupKey] = set()
        for item in self._waiting[target]:
            key = None if item.group is None else (item.queue, item.group)
            if key is not None and (
                key in held_groups
                or key in self._groups_on_the_wire
                or any(order < item.order for at, order in heads[key].items() if at != target)
            ):
                held_groups.add(key)
                continue
            fits = not entries or size + item.size <= item.call_limit
            if item.not_before > now or not fits:
                full = full or not fits
                if key is not None:
                    held_groups.add(key)
                continue
            entries.append(item)
            size += item.size
            if len(entries) == SQS_BATCH_SIZE:
                return entries, True
        return entries, full

    def _take(self, target: Hashable, entries: list[Unsent]) -> None:
        taken = set(map(id, entries))
        kept = [item for item in self._waiting[target] if id(item) not in taken]
        if kept:
            self._waiting[target] = kept
        else:
            del self._waiting[target]
        self._in_flight += len(entries)
        self._bytes_waiting -= sum(item.size for item in entries)
        for item in entries:
            if item.group is not None:
                self._groups_on_the_wire.add((item.queue, item.group))

    def _put_back(self, item: Unsent) -> None:
        """Back in its place by publication order, ahead of what was published after it."""
        items = self._waiting.setdefault(item.target, [])
        bisect.insort(items, item, key=lambda unsent: unsent.order)
        self._bytes_waiting += item.size
