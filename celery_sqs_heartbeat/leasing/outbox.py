"""Deletes and releases waiting to be sent to SQS: pure bookkeeping, time passed in.

An ack or a reject is a decision about a message; telling SQS is a request, and SQS
bills per request, not per entry. So decisions wait here, per queue, until ten of one
kind are waiting or one of them is due (``ack_batch_interval`` after the ack), and then
go out as one ``DeleteMessageBatch`` or ``ChangeMessageVisibilityBatch``, taking along
whatever else of that queue and kind is waiting. A message that must go at once (FIFO:
its message group waits for its delete) is simply due at once.

The lease of a message waiting here is still renewed: SQS keeps the message hidden
until the delete is confirmed, so a failed delete never hands a finished task to another
worker. A transient failure puts the entry back, to be tried again after
``retry_delay``, as long as its lease holds: sooner if its lease is about to run out, but
never sooner than :data:`RETRY_FLOOR` after the try that failed, and not along with
other calls before then.

Like :mod:`celery_sqs_heartbeat.leasing.leases`, nothing here is thread-safe or does I/O: the
manager holds its lock around every call and makes the SQS calls outside it.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum

from ..aws.sqs_facts import SQS_BATCH_SIZE
from .leases import EntryResult, Lease

__all__ = ["Outbox", "OutboxBatch", "OutboxSettlement", "Outgoing", "Request"]

#: Seconds before its lease runs out by which an entry goes out, whatever its batch wait.
EXPIRY_MARGIN = 1.0

#: Seconds a failed entry waits at least before it goes out again, whatever its lease:
#: the margin above is already past for a retry in a lease's last second, so without a
#: floor a failing SQS gets the same call again as soon as it answers (issue 33: 560
#: deletes in one run). Half the margin, so a delete that fails as its margin begins
#: still has one more try before the lease ends; two tries in that second, not hundreds.
RETRY_FLOOR = EXPIRY_MARGIN / 2

#: Seconds a delete is remembered by message id once it is settled, whether SQS
#: confirmed it or it was given up. SQS answers a delete by an older receipt handle with
#: success and deletes nothing: that happens when the lease ran out and a receive took
#: the message again before the delete landed. If that receive was this worker's, its
#: answer may reach the channel after the delete's (a long poll answers at once with a
#: message, then waits for the event loop), and the task must not run again. A delete
#: given up (SQS failing past the lease, as in an outage, or the handle refused) leaves
#: the message to come back once SQS shows it again; the task ran here all the same. A
#: minute covers a long poll (20 s at most) and a slow loop many times over, and the
#: first receives after a short outage.
DELETED_MEMORY = 60.0


class Request(Enum):
    """What SQS is asked to do with a message."""

    DELETE = "delete"
    #: Make it visible again after the entry's delay: ChangeMessageVisibility.
    RELEASE = "release"


@dataclass(eq=False)
class Outgoing:
    """One message's pending delete or release."""

    lease: Lease
    request: Request
    #: The visibility a release sets; unused for deletes.
    delay: int = 0
    reason: str = ""
    #: When it should go out at the latest, on the caller's clock.
    due_at: float = 0.0
    attempts: int = 0
    #: Not to go out before this, alone or along with others: its retry after a failed try.
    retry_at: float = float("-inf")


@dataclass(frozen=True)
class OutboxBatch:
    """One call: up to ten entries of one kind for one queue."""

    queue: Hashable
    request: Request
    entries: tuple[Outgoing, ...]


@dataclass
class OutboxSettlement:
    """What came of a batch: for the manager to end leases, count and report."""

    done: list[Outgoing] = field(default_factory=list)
    #: SQS no longer knows the receipt handle: the delete or release can never happen.
    lost: list[tuple[Outgoing, str]] = field(default_factory=list)
    #: Failed, and put back for another try.
    retried: list[tuple[Outgoing, str]] = field(default_factory=list)
    #: Failed, and given up on because the lease ran out meanwhile.
    abandoned: list[tuple[Outgoing, str]] = field(default_factory=list)
    #: Releases SQS refused as hiding past its 12 hours: put back to go out at once with
    #: no delay, so the message is visible now rather than at the end of its lease.
    beyond_limit: list[tuple[Outgoing, str]] = field(default_factory=list)

    def ended(self) -> list[Outgoing]:
        """The entries done with, for better or worse: not to be tried again."""
        return [*self.done, *(item for item, _ in [*self.lost, *self.abandoned])]


class Outbox:
    """Pending deletes and releases, per queue and kind, in the order they were decided."""

    def __init__(self, retry_delay: float) -> None:
        self.retry_delay = retry_delay
        self._waiting: dict[tuple[Hashable, Request], list[Outgoing]] = {}
        self._in_flight = 0
        #: Deletes waiting or on the wire, by SQS message id.
        self._deletes: dict[str, Outgoing] = {}
        #: Deletes SQS confirmed in the last :data:`DELETED_MEMORY` seconds, oldest first.
        self._deleted: OrderedDict[str, tuple[Lease, float]] = OrderedDict()

    def __len__(self) -> int:
        """Entries waiting or on the wire."""
        return sum(len(items) for items in self._waiting.values()) + self._in_flight

    def __iter__(self) -> Iterator[Outgoing]:
        for items in self._waiting.values():
            yield from items

    def deletes_waiting(self) -> int:
        """Deletes not yet on the wire: what the ``deletes_pending`` gauge shows."""
        return sum(1 for item in self if item.request is Request.DELETE)

    def add(self, item: Outgoing, due_at: float) -> None:
        """Wait until ``due_at`` at the latest; sooner if a batch fills up or another is due.

        Never past the lease, though: a lease that is no longer renewed (capped, lost, or
        renewals turned off) must not run out while its delete waits for company, or
        SQS hands the finished task to someone else. Nor before its ``retry_at``.
        """
        item.due_at = max(min(due_at, item.lease.expires_at - EXPIRY_MARGIN), item.retry_at)
        if item.request is Request.DELETE and item.lease.message_id:
            self._deletes[item.lease.message_id] = item
        self._waiting.setdefault((item.lease.queue, item.request), []).append(item)

    def redirect_delete(self, lease: Lease, now: float) -> Lease | None:
        """Delete ``lease``, a new receive of a message deleted here, instead.

        SQS hands a message out again when its lease ran out before the delete landed;
        a delete by the older receipt handle then succeeds without deleting it. So a
        pending delete moves to the new receipt, and a delete confirmed in the last
        :data:`DELETED_MEMORY` seconds is sent again by it; either way the task is not
        run again. Returns the lease the delete was for, or None if it was for none.
        """
        message_id = lease.message_id or ""
        item = self._deletes.get(message_id)
        if item is not None and item.lease.queue == lease.queue:
            replaced, item.lease = item.lease, lease
            return replaced
        deleted, confirmed_at = self._deleted.get(message_id, (None, -DELETED_MEMORY))
        if deleted is None or deleted.queue != lease.queue or confirmed_at <= now - DELETED_MEMORY:
            return None
        del self._deleted[message_id]
        self.add(Outgoing(lease, Request.DELETE), now)
        return deleted

    def hurry(self, now: float) -> None:
        """Make every entry not tried yet due now: a channel closes, the process ends.

        One that failed still waits for its retry, so a failing SQS is not hammered for
        as long as a flush may wait.
        """
        for item in self:
            if not item.attempts:
                item.due_at = min(item.due_at, now)

    def next_due(self) -> float | None:
        """When the next call is owed, if anything waits; a full batch is owed now.

        Entries waiting for their retry make a full batch only once ten may go.
        """
        owed = [
            min(min(i.due_at for i in ready), _full_at(ready))
            for items in self._waiting.values()
            if (ready := _sendable(items))
        ]
        return min(owed, default=None)

    def due_batches(self, now: float, limit: int | None = None) -> list[OutboxBatch]:
        """The calls to make now; their entries count as on the wire until settled.

        Full batches always go. The rest of a queue's entries of one kind go together
        once any of them is due, so an entry due now takes the others along instead of
        leaving them for a call of their own a moment later. At most ``limit`` calls
        (None: every due one); what does not fit waits, still due, in its place.
        """
        batches: list[OutboxBatch] = []
        for key in list(self._waiting):
            room = None if limit is None else limit - len(batches)
            if room is not None and room <= 0:
                break
            queue, request = key
            for chunk in self._take_due(key, now, room):
                batches.append(OutboxBatch(queue, request, chunk))
                self._in_flight += len(chunk)
        return batches

    def _take_due(
        self, key: tuple[Hashable, Request], now: float, room: int | None
    ) -> list[tuple[Outgoing, ...]]:
        """Take the due calls of one queue and kind, ``room`` at most, leaving the rest."""
        items = _sendable(self._waiting[key], now)
        going = set(map(id, items))
        held = [item for item in self._waiting[key] if id(item) not in going]
        if any(item.due_at <= now for item in items):
            sending, kept = items, held
        else:
            full = len(items) - len(items) % SQS_BATCH_SIZE
            sending, kept = items[:full], items[full:] + held
        if room is not None and len(sending) > room * SQS_BATCH_SIZE:
            kept = sending[room * SQS_BATCH_SIZE :] + kept
            sending = sending[: room * SQS_BATCH_SIZE]
        if kept:
            self._waiting[key] = kept
        else:
            del self._waiting[key]
        return [
            tuple(sending[start : start + SQS_BATCH_SIZE])
            for start in range(0, len(sending), SQS_BATCH_SIZE)
        ]

    def settle(
        self,
        batch: OutboxBatch,
        results: Mapping[Lease, tuple[EntryResult, str]],
        now: float,
    ) -> OutboxSettlement:
        """Apply SQS's answer to ``batch``; ``now`` is when it arrived.

        A release refused as past SQS's 12 hours is tried once more, with no delay: its
        handle still holds the message, and the delay decided (a backoff, a park) can no
        longer be had, so the message had better be visible now than hidden for the rest
        of a lease nobody renews. Refused even so, it is given up: the lease is then over
        by SQS's clock, so the message is visible again anyway. Neither is a lost lease.
        """
        settlement = OutboxSettlement()
        self._in_flight -= len(batch.entries)
        for item in batch.entries:
            item.attempts += 1
            # An entry redirected to a newer receipt while on the wire finds no answer
            # for its new lease here, and goes out again with it.
            outcome, reason = results.get(item.lease, (EntryResult.TRANSIENT, "no answer"))
            if outcome is EntryResult.TRANSIENT and now < item.lease.expires_at:
                retry_at = min(now + self.retry_delay, item.lease.expires_at - EXPIRY_MARGIN)
                item.retry_at = max(retry_at, now + RETRY_FLOOR)
                self.add(item, item.retry_at)
                settlement.retried.append((item, reason))
                continue
            if outcome is EntryResult.BEYOND_LIMIT and item.delay:
                item.delay = 0
                self.add(item, now)
                settlement.beyond_limit.append((item, reason))
                continue
            self._forget(item)
            self._remember_deleted(item, now)
            if outcome is EntryResult.OK:
                settlement.done.append(item)
            elif outcome is EntryResult.LOST:
                settlement.lost.append((item, reason))
            else:
                settlement.abandoned.append((item, reason))
        return settlement

    def _remember_deleted(self, item: Outgoing, now: float) -> None:
        while self._deleted:
            message_id, (_, confirmed_at) = next(iter(self._deleted.items()))
            if confirmed_at > now - DELETED_MEMORY:
                break
            del self._deleted[message_id]
        if item.request is Request.DELETE and item.lease.message_id:
            self._deleted[item.lease.message_id] = (item.lease, now)

    def _forget(self, item: Outgoing) -> None:
        message_id = item.lease.message_id
        if item.request is Request.DELETE and message_id and self._deletes.get(message_id) is item:
            del self._deletes[message_id]


def _sendable(items: list[Outgoing], now: float = float("inf")) -> list[Outgoing]:
    """The entries that may go out at ``now``: not those whose lease is being renewed.

    Renewals are on the wire side by side with deletes; a delete sent meanwhile could
    land first and leave SQS to refuse the renewal. It goes out when the renewal is
    back, so the delete is the last word, as a release is. Nor those waiting for their
    retry, not even along with others due; without ``now``, those that may go some time.
    """
    return [item for item in items if not item.lease.renewing and item.retry_at <= now]


def _full_at(items: list[Outgoing]) -> float:
    """When ten of ``items`` may go out: a full call, owed whether or not any is due."""
    if len(items) < SQS_BATCH_SIZE:
        return float("inf")
    return heapq.nsmallest(SQS_BATCH_SIZE, (item.retry_at for item in items))[-1]
