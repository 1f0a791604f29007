"""Lease bookkeeping and renewal scheduling: pure, no I/O, time passed in.

A *lease* is the stretch during which SQS keeps one received message invisible. It is
born when the worker receives the message, renewed while the task is pending, and ends
at the ack, the reject, or when it is lost or reaches SQS's 12-hour limit.

Everything here is decided from the caller's clock so it can be tested without waiting,
and the caller (``manager``) holds a lock around every call: nothing here is thread-safe.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "SQS_MAX_HOLD_SECONDS",
    "EntryResult",
    "Lease",
    "LeaseBook",
    "LeasePolicy",
    "Release",
    "RenewalBatch",
    "Settlement",
]

#: SQS never keeps a message invisible for longer than this after one receive.
SQS_MAX_HOLD_SECONDS = 43200

#: The receive is timestamped when the response has arrived, a little after SQS started
#: the clock, so the last renewal stops this much short of the 12 hours to stay valid.
HOLD_MARGIN_SECONDS = 60

#: ChangeMessageVisibilityBatch and DeleteMessageBatch take at most ten entries.
SQS_BATCH_SIZE = 10


@dataclass(frozen=True)
class LeasePolicy:
    """How one connection's leases are renewed; the shared manager mixes connections."""

    visibility_timeout: int
    threshold: float
    max_hold: float | None = None

    @property
    def hold_limit(self) -> float:
        """Seconds after the receive at which renewing stops for good."""
        limit = float(SQS_MAX_HOLD_SECONDS - HOLD_MARGIN_SECONDS)
        if self.max_hold is not None:
            limit = min(limit, self.max_hold)
        return limit


@dataclass(eq=False)
class Lease:
    """One received, not yet acked message, and what is known of its invisibility."""

    receipt_handle: str
    queue: Hashable
    policy: LeasePolicy
    received_at: float
    task_id: str | None = None
    task_name: str | None = None
    message_id: str | None = None
    receive_count: int = 1
    expires_at: float = field(init=False)
    renewals: int = 0
    renewing: bool = False
    ended: bool = False
    #: Reported lost (WARNING and ``lease_lost``): never reported twice.
    lost: bool = False
    pending_release: Release | None = None

    def __post_init__(self) -> None:
        self.expires_at = self.received_at + self.policy.visibility_timeout

    @property
    def hold_deadline(self) -> float:
        return self.received_at + self.policy.hold_limit

    @property
    def due_at(self) -> float:
        return self.expires_at - self.policy.threshold

    def describe(self) -> str:
        return f"task {self.task_name or '?'}[{self.task_id or '?'}]"


@dataclass(frozen=True)
class RenewalBatch:
    """One ChangeMessageVisibilityBatch call: up to ten leases of one queue."""

    queue: Hashable
    entries: tuple[tuple[Lease, int], ...]
    sent_at: float


class EntryResult(Enum):
    """What SQS said about one entry of a visibility change."""

    OK = "ok"
    #: The receipt handle no longer holds the message: it was redelivered, deleted, or
    #: its visibility already ran out. Asking again cannot help.
    LOST = "lost"
    #: Throttling, a server error or a network fault: worth asking again.
    TRANSIENT = "transient"


@dataclass(frozen=True)
class Release:
    """A message to make visible again after ``delay`` seconds, instead of deleting it."""

    lease: Lease
    delay: int
    reason: str = ""


@dataclass
class Settlement:
    """What the manager must report after a renewal batch came back."""

    renewed: list[tuple[Lease, int]] = field(default_factory=list)
    capped: list[Lease] = field(default_factory=list)
    lost: list[tuple[Lease, str]] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)


class _QueueLeases:
    """One queue's leases, and a heap of them by when they come due."""

    __slots__ = ("due", "heap", "leases", "stale")

    def __init__(self) -> None:
        self.leases: dict[int, Lease] = {}
        #: ``(due_at, sequence, lease)``; a lease has one entry while it waits for its
        #: next renewal, none while one is on the wire. Entries of ended leases stay
        #: until they surface or the heap is rebuilt: ``stale`` counts them.
        self.heap: list[tuple[float, int, Lease]] = []
        self.stale = 0
        #: Popped by :meth:`LeaseBook.take_exhausted`, due and renewable, for
        #: :meth:`LeaseBook.due_batches` to send: closest to due first.
        self.due: list[Lease] = []


class LeaseBook:
    """The leases a process is renewing, per queue, in the order they come due.

    A worker may hold SQS's in-flight limit, 120,000 messages a queue, and every ack and
    receive waits for the lock this book is used under. So nothing here looks at every
    lease: each queue keeps a binary heap keyed by ``due_at``. A check with nothing due
    reads the top of each queue's heap, O(queues); one that renews k leases pops k, and
    at most nine more to fill the last call, O(k log n); an ack is O(1), leaving its heap
    entry to be skipped when it surfaces. The heap is rebuilt when stale entries
    outnumber live ones, so memory follows the leases held.

    A timing wheel would make adding O(1) too, but a renewal call must be filled with the
    leases *closest* to due, which a wheel knows only to the width of a slot; and a heap
    needs no slot width chosen for thresholds that vary from 0.1 s to hours.
    """

    def __init__(self) -> None:
        self._by_queue: dict[Hashable, _QueueLeases] = {}
        self._releases_waiting: set[Lease] = set()
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return sum(len(queue.leases) for queue in self._by_queue.values())

    def __iter__(self) -> Iterator[Lease]:
        """Every lease being renewed, queue by queue (for inspection, under the lock)."""
        for queue in self._by_queue.values():
            yield from queue.leases.values()

    def add(self, lease: Lease) -> None:
        queue = self._by_queue.get(lease.queue)
        if queue is None:
            queue = self._by_queue[lease.queue] = _QueueLeases()
        queue.leases[id(lease)] = lease
        self._schedule(queue, lease)

    def end(
        self, lease: Lease, release_delay: int | None = None, reason: str = ""
    ) -> Release | None:
        """Stop renewing ``lease`` (ack, reject or shutdown); maybe release it.

        A renewal already on the wire cannot be recalled, and if it landed after a
        release it would hide the message again. So a lease that is being renewed keeps
        its release until :meth:`settle` sees that renewal come back.
        """
        if lease.ended:
            return None
        lease.ended = True
        self._discard(lease)
        if release_delay is None:
            return None
        release = Release(lease, release_delay, reason)
        if lease.renewing:
            lease.pending_release = release
            self._releases_waiting.add(lease)
            return None
        return release

    def releases_waiting(self) -> bool:
        """Whether a release still waits for a renewal on the wire to come back."""
        return bool(self._releases_waiting)

    def take_exhausted(self, now: float) -> list[Lease]:
        """Due leases that cannot be renewed even by a second before their hold limit.

        Renewing with a visibility of 0 would hand a running task to another worker, so
        these are simply no longer renewed: SQS makes them visible when the lease ends.
        """
        exhausted = []
        for queue in list(self._by_queue.values()):
            self._pop_due(queue, now)
            renewable = []
            for lease in queue.due:
                if self._renewal_length(lease, now) < 1:
                    exhausted.append(lease)
                else:
                    renewable.append(lease)
            queue.due = renewable
        for lease in exhausted:
            self._discard(lease)
        return exhausted

    def due_batches(self, now: float) -> list[RenewalBatch]:
        """The renewal calls to make at ``now``, leases inside marked as being renewed.

        SQS bills a call, not an entry. So once any lease of a queue is due, the call is
        filled up to ten with the leases closest to due: renewing them a little early
        costs nothing and puts them into a cohort that comes due together next time.
        Call :meth:`take_exhausted` first, so no entry asks for a visibility of 0.
        """
        batches = []
        for name, queue in self._by_queue.items():
            self._pop_due(queue, now)
            chosen: list[Lease] = []
            exhausted: list[Lease] = []
            for lease in queue.due:
                (chosen if self._renewal_length(lease, now) >= 1 else exhausted).append(lease)
            # Exhausted ones stay for take_exhausted: never renewed for 0 seconds.
            queue.due = exhausted
            if not chosen:
                continue
            chosen.extend(self._closest_to_due(queue, now, -len(chosen) % SQS_BATCH_SIZE))
            for start in range(0, len(chosen), SQS_BATCH_SIZE):
                entries = tuple(
                    (lease, self._renewal_length(lease, now))
                    for lease in chosen[start : start + SQS_BATCH_SIZE]
                )
                for lease, _ in entries:
                    lease.renewing = True
                batches.append(RenewalBatch(name, entries, now))
        return batches

    def _pop_due(self, queue: _QueueLeases, now: float) -> None:
        """Move the queue's due leases from its heap to ``queue.due``, closest first."""
        while queue.heap and queue.heap[0][0] <= now:
            _, _, lease = heapq.heappop(queue.heap)
            if self._is_live(queue, lease):
                queue.due.append(lease)
            else:
                queue.stale -= 1

    def _closest_to_due(self, queue: _QueueLeases, now: float, count: int) -> list[Lease]:
        """Up to ``count`` leases not due yet, closest first, that a renewal would extend."""
        closest: list[Lease] = []
        unfit: list[tuple[float, int, Lease]] = []
        while queue.heap and len(closest) < count:
            entry = heapq.heappop(queue.heap)
            lease = entry[2]
            if not self._is_live(queue, lease):
                queue.stale -= 1
            elif self._renewal_length(lease, now) >= 1:
                closest.append(lease)
            else:
                unfit.append(entry)
        for entry in unfit:
            heapq.heappush(queue.heap, entry)
        return closest

    @staticmethod
    def _is_live(queue: _QueueLeases, lease: Lease) -> bool:
        return id(lease) in queue.leases and not lease.renewing

    def _schedule(self, queue: _QueueLeases, lease: Lease) -> None:
        heapq.heappush(queue.heap, (lease.due_at, next(self._sequence), lease))

    @staticmethod
    def _renewal_length(lease: Lease, now: float) -> int:
        full = lease.policy.visibility_timeout
        return max(0, min(full, math.floor(lease.hold_deadline - now)))

    def settle(
        self, batch: RenewalBatch, results: Mapping[Lease, tuple[EntryResult, str]], now: float
    ) -> Settlement:
        """Apply SQS's answer to ``batch``; ``now`` is when the answer arrived."""
        settlement = Settlement()
        for lease, length in batch.entries:
            lease.renewing = False
            outcome, reason = results.get(lease, (EntryResult.TRANSIENT, "no answer"))
            if lease.ended:
                # Acked or released meanwhile: whatever SQS said is moot now, except that
                # the release it was waiting for can go out.
                if lease.pending_release is not None:
                    settlement.releases.append(lease.pending_release)
                    lease.pending_release = None
                    self._releases_waiting.discard(lease)
                continue
            if outcome is EntryResult.OK:
                # Counted from when the call was sent: SQS started the new lease at some
                # point after that, so this errs on the early side.
                lease.expires_at = batch.sent_at + length
                lease.renewals += 1
                settlement.renewed.append((lease, length))
                if length < lease.policy.visibility_timeout:
                    self._discard(lease)
                    settlement.capped.append(lease)
                    continue
            elif outcome is EntryResult.LOST:
                self._discard(lease)
                settlement.lost.append((lease, reason))
                continue
            elif now >= lease.expires_at:
                self._discard(lease)
                settlement.lost.append((lease, f"lease ran out while renewals failed: {reason}"))
                continue
            queue = self._by_queue.get(lease.queue)
            if queue is not None and id(lease) in queue.leases:
                self._schedule(queue, lease)
        return settlement

    def _discard(self, lease: Lease) -> None:
        """Forget ``lease``; its heap entry, if it has one, becomes stale."""
        queue = self._by_queue.get(lease.queue)
        if queue is None or queue.leases.pop(id(lease), None) is None:
            return
        if lease in queue.due:
            queue.due.remove(lease)
        elif not lease.renewing:
            queue.stale += 1
        if not queue.leases:
            del self._by_queue[lease.queue]
        elif queue.stale > len(queue.leases):
            self._rebuild(queue)

    def _rebuild(self, queue: _QueueLeases) -> None:
        """Drop the stale entries: O(n), once per n ends at most, so O(1) per end."""
        queue.heap = [entry for entry in queue.heap if self._is_live(queue, entry[2])]
        heapq.heapify(queue.heap)
        queue.stale = 0
