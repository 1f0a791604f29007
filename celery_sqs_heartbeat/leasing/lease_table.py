"""The leases one channel holds, by delivery tag: pure bookkeeping, no I/O.

A channel holds a message from the moment SQS answers the receive until the ack or
reject, in two stages: *received* (admitted here, not yet handed to the consumer) and
*delivered* (claimed by the consumer, whose task may be running, prefetched or waiting
for its ETA). The delivery tag is the receipt handle of the receive that brought the
message; it stays the tag even when a later receive of the same message takes over
(:meth:`LeaseTable.adopt`), because kombu and Celery know the message by it.

The manager renews; this table only answers "which lease is the message behind this
tag?", which is what an ack, a reject or a shutdown asks. Receives come from the
channel's own thread (the event loop, or the blocking receive loop), but acks and rejects
come from wherever the task ended: a threads pool's thread, a greenlet. kombu lets those
through without a lock of its own (``QoS._dirty``), so every call here takes the table's
lock, held only for a few dictionary operations.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from .leases import Lease

__all__ = ["LeaseTable"]


class LeaseTable:
    """Received and delivered leases of one channel, by tag and by SQS message id."""

    def __init__(self) -> None:
        self._received: dict[str, Lease] = {}
        self._delivered: dict[str, Lease] = {}
        self._tags_by_message_id: dict[str, str] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._received) + len(self._delivered)

    def delivered(self) -> Iterator[tuple[str, Lease]]:
        """The delivered leases and their tags, as a snapshot."""
        with self._lock:
            return iter(list(self._delivered.items()))

    def holds(self, lease: Lease) -> bool:
        """Whether ``lease`` is one this table holds, received or delivered."""
        with self._lock:
            return any(
                held is lease for held in [*self._received.values(), *self._delivered.values()]
            )

    def get(self, tag: str) -> Lease | None:
        """The delivered lease behind ``tag``, if it is still held."""
        with self._lock:
            return self._delivered.get(tag)

    def admit(self, lease: Lease) -> None:
        """A message has just been received: hold its lease until the consumer claims it."""
        with self._lock:
            self._received[lease.receipt_handle] = lease
            if lease.message_id:
                self._tags_by_message_id[lease.message_id] = lease.receipt_handle

    def adopt(self, lease: Lease) -> Lease | None:
        """If ``lease`` is a new receive of a message held here, put it in the old one's place.

        SQS hands a message out again when its lease lapsed (an outage longer than a
        lease), maybe to this very worker. The holder keeps its tag and task, on the new
        lease. Returns the lease replaced, which the caller stops renewing; None if the
        message is not held here.
        """
        with self._lock:
            tag = self._tags_by_message_id.get(lease.message_id or "")
            if tag is None:
                return None
            for table in (self._delivered, self._received):
                held = table.get(tag)
                if held is not None:
                    lease.take_over(held)
                    table[tag] = lease
                    return held
            return None

    def claim(self, tag: str, task_id: str | None, task_name: str | None) -> Lease | None:
        """The consumer took the message: its lease now lasts until the ack or reject.

        None if the message was not received through this table (kombu's ``basic_get``).
        """
        with self._lock:
            lease = self._received.pop(tag, None)
            if lease is None:
                return None
            lease.task_id, lease.task_name = task_id, task_name
            self._delivered[tag] = lease
            if lease.message_id:
                self._tags_by_message_id[lease.message_id] = tag
            return lease

    def let_go(self, tag: str) -> Lease | None:
        """Forget a delivered message (acked, rejected, released); its lease, if held."""
        with self._lock:
            lease = self._delivered.pop(tag, None)
            if lease is not None:
                self._forget_message_id(lease, tag)
            return lease

    def take_unclaimed(self) -> list[Lease]:
        """Every received lease no consumer claimed, forgotten here.

        kombu hands a receive's messages to the consumer before it returns, so what is
        left once it returned never will be: a body kombu could not decode, say.
        """
        with self._lock:
            unclaimed = list(self._received.items())
            self._received.clear()
            for tag, lease in unclaimed:
                self._forget_message_id(lease, tag)
            return [lease for _, lease in unclaimed]

    def _forget_message_id(self, lease: Lease, tag: str) -> None:
        """Under the lock."""
        if lease.message_id and self._tags_by_message_id.get(lease.message_id) == tag:
            del self._tags_by_message_id[lease.message_id]
