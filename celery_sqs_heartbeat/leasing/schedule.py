"""When each lease is due: the per-queue heaps of one process's renewals. Pure, time passed in.

Apart from :class:`~celery_sqs_heartbeat.leasing.book.LeaseBook` because it is a
different job: the book decides what a lease's life is (ended, released, renewed, lost),
this module only keeps the order in which held leases come due, and packs the due ones
into calls. Its cost is what every ack and receive waits for, so it is measured on its
own (``looked_at``, benchmarks/scheduler_cost.py), and its heaps can be read without the
rules of the 12 hours or of a release racing a renewal.

Like the book, nothing here is thread-safe: the manager holds its lock around every call.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from ..aws.sqs_facts import SQS_BATCH_SIZE
from .leases import AdaptiveMargin, Lease, LeasePolicy

__all__ = ["LOOKS_PER_BATCH", "RenewalBatch", "RenewalSchedule"]

#: Whole-call codes aside, the most leases one :meth:`RenewalSchedule.due_batches` call looks at
#: per call it returns: the ten it renews and up to ten more (fillers, entries of ended
#: leases). It bounds how long the caller holds its lock for each call it takes.
LOOKS_PER_BATCH = 2 * SQS_BATCH_SIZE


@dataclass(frozen=True)
class RenewalBatch:
    """One ChangeMessageVisibilityBatch call: up to ten leases of one queue."""

    queue: Hashable
    entries: tuple[tuple[Lease, int], ...]
    sent_at: float


class _QueueLeases:
    """The leases of one queue and one policy, and a heap of them by expiry."""

    __slots__ = ("due", "exhausted", "heap", "leases", "policy", "queue", "retrying", "stale")

    def __init__(self, queue: Hashable, policy: LeasePolicy) -> None:
        self.queue = queue
        self.policy = policy
        self.leases: dict[int, Lease] = {}
        #: ``(expires_at, sequence, lease)``; a lease has one entry while it waits for its
        #: next renewal, none while it is due or on the wire. Entries of ended leases stay
        #: until they surface or the heap is rebuilt: ``stale`` counts them.
        self.heap: list[tuple[float, int, Lease]] = []
        self.stale = 0
        #: Popped from the heap, due and renewable, waiting for a call: closest first.
        #: Leases that ended meanwhile are skipped when they come up.
        self.due: deque[Lease] = deque()
        #: Popped, due, and unable to get another second: for :meth:`take_exhausted`.
        self.exhausted: list[Lease] = []
        #: ``(retry at, sequence, lease)``: leases whose renewal failed, out of ``heap``
        #: until the next check. Due all the same, so kept apart: in ``heap`` they would be
        #: renewed by every check, and the thread checks whenever a delete, a release or a
        #: call coming back wakes it, which in an outage is hundreds of times a second.
        #: Entries of leases ended meanwhile are dropped when they surface.
        self.retrying: list[tuple[float, int, Lease]] = []


class _Budget:
    """How many more heap entries or due leases one call may look at; None: no limit."""

    __slots__ = ("left",)

    def __init__(self, left: int | None) -> None:
        self.left = left

    def spend(self) -> bool:
        """Take one look if any is left."""
        if self.left is None:
            return True
        if self.left <= 0:
            return False
        self.left -= 1
        return True

    @property
    def spent(self) -> bool:
        return self.left is not None and self.left <= 0


class RenewalSchedule:
    """The held leases, per queue, in the order they come due, packed into calls when due.

    A worker may hold SQS's in-flight limit (``SQS_MAX_IN_FLIGHT``, 120,000 a queue), and
    every ack and receive waits for the lock this schedule is used under. So nothing here
    looks at every lease: each queue keeps a binary heap keyed by expiry. A check with
    nothing due reads the top of each queue's heap, O(queues); one that renews k leases pops
    k, and at most nine more to fill the last call, O(k log n); an ack is O(1), leaving its
    heap entry to be skipped when it surfaces. The heap is rebuilt when stale entries
    outnumber live ones, so memory follows the leases held.

    A burst of due leases must not hold the lock for long either, so
    :meth:`due_batches` and :meth:`take_exhausted` take a ``limit``: the caller loops,
    taking the lock for a few calls' worth of leases at a time, while :meth:`has_due`.

    Keyed by expiry, not by ``expiry - margin``, because the adaptive margin moves: a
    lease is due once ``expires_at <= now + margin``, with the margin of the moment. So
    each heap holds the leases of one queue *and one policy* (the margin is per policy);
    two connections with different lease settings on one queue make two groups, renewed
    in separate calls, which costs calls only in that rare set-up.

    A timing wheel would make adding O(1) too, but a renewal call must be filled with the
    leases *closest* to due, which a wheel knows only to the width of a slot; and a heap
    needs no slot width chosen for margins that vary from 0.1 s to hours.

    A lease whose renewal failed waits in a second heap of its queue, by retry time
    (:meth:`retry_at`), and goes back into the first when that time came.
    """

    def __init__(self, margin: AdaptiveMargin) -> None:
        self._margin = margin
        self._by_queue: dict[tuple[Hashable, LeasePolicy], _QueueLeases] = {}
        self._sequence = itertools.count()
        #: Heap entries and due leases looked at since the schedule was made: what bounds
        #: the time a caller holds its lock, counted for tests and benchmarks.
        self.looked_at = 0

    def __len__(self) -> int:
        return sum(len(queue.leases) for queue in self._by_queue.values())

    def __iter__(self) -> Iterator[Lease]:
        """Every lease being renewed, queue by queue (for inspection, under the lock)."""
        for queue in self._by_queue.values():
            yield from queue.leases.values()

    def add(self, lease: Lease) -> None:
        """Hold ``lease``, due by its expiry."""
        key = (lease.queue, lease.policy)
        queue = self._by_queue.get(key)
        if queue is None:
            queue = self._by_queue[key] = _QueueLeases(lease.queue, lease.policy)
        queue.leases[id(lease)] = lease
        self._schedule(queue, lease)

    def holds(self, lease: Lease) -> bool:
        """Whether ``lease`` is held: scheduled, due, on the wire or waiting to retry."""
        return self._queue_holding(lease) is not None

    def renewed(self, lease: Lease) -> None:
        """A renewal of ``lease`` came back: due again by its new expiry, if still held."""
        queue = self._queue_holding(lease)
        if queue is not None:
            self._schedule(queue, lease)

    def retry_at(self, lease: Lease, when: float) -> None:
        """A renewal of ``lease`` failed: due again at ``when``, if still held, not sooner."""
        queue = self._queue_holding(lease)
        if queue is not None:
            heapq.heappush(queue.retrying, (when, next(self._sequence), lease))

    def _queue_holding(self, lease: Lease) -> _QueueLeases | None:
        queue = self._by_queue.get((lease.queue, lease.policy))
        return queue if queue is not None and self._is_held(queue, lease) else None

    def has_due(self, now: float) -> bool:
        """Whether a due or exhausted lease (or a stale entry) waits: O(queues)."""
        return any(
            queue.due
            or queue.exhausted
            or self._top_is_due(queue, now)
            or (queue.retrying and queue.retrying[0][0] <= now)
            for queue in self._by_queue.values()
        )

    def take_exhausted(self, now: float, limit: int | None = None) -> list[Lease]:
        """Due leases that cannot be renewed even by a second before their hold limit.

        Renewing with a visibility of 0 would hand a running task to another worker, so
        these are simply no longer renewed: SQS makes them visible when the lease ends.
        Looks at no more than ``limit`` heap entries (None: every due one).
        """
        budget = _Budget(limit)
        exhausted: list[Lease] = []
        for queue in list(self._by_queue.values()):
            self._pop_due(queue, now, None, budget)
            exhausted.extend(lease for lease in queue.exhausted if self._is_held(queue, lease))
            queue.exhausted = []
        for lease in exhausted:
            self.discard(lease)
        return exhausted

    def due_batches(self, now: float, limit: int | None = None) -> list[RenewalBatch]:
        """The renewal calls to make at ``now``, leases inside marked as being renewed.

        SQS bills a call, not an entry. So once any lease of a queue is due, the call is
        filled up to ten with the leases closest to due: renewing them a little early
        costs nothing and puts them into a cohort that comes due together next time.
        Leases that cannot get another second are left for :meth:`take_exhausted`.

        With a ``limit``, at most that many calls, looking at no more than
        :data:`LOOKS_PER_BATCH` leases per call, queues taken in turn; call again while
        :meth:`has_due` says more is due.
        """
        budget = _Budget(None if limit is None else limit * LOOKS_PER_BATCH)
        batches: list[RenewalBatch] = []
        pending = list(self._by_queue.values())
        while pending and (limit is None or len(batches) < limit) and not budget.spent:
            served = []
            for queue in pending:
                if (limit is not None and len(batches) >= limit) or budget.spent:
                    break
                batch = self._next_batch(queue, now, budget)
                if batch is not None:
                    batches.append(batch)
                    served.append(queue)
            pending = served
        return batches

    def _next_batch(self, queue: _QueueLeases, now: float, budget: _Budget) -> RenewalBatch | None:
        """One call of ``queue``'s due leases, filled with the closest to due if short."""
        chosen: list[Lease] = []
        while len(chosen) < SQS_BATCH_SIZE:
            if not queue.due:
                self._pop_due(queue, now, SQS_BATCH_SIZE - len(chosen), budget)
                if not queue.due:
                    break
            lease = queue.due.popleft()
            if not self._is_held(queue, lease):
                continue
            if self._renewal_length(lease, now) >= 1:
                chosen.append(lease)
            else:
                queue.exhausted.append(lease)
        if len(chosen) < SQS_BATCH_SIZE and self._top_is_due(queue, now):
            # The budget ran out before every due lease was popped: fill next time.
            queue.due.extendleft(reversed(chosen))
            return None
        if not chosen:
            return None
        chosen.extend(self._closest_to_due(queue, now, SQS_BATCH_SIZE - len(chosen), budget))
        entries = tuple((lease, self._renewal_length(lease, now)) for lease in chosen)
        for lease in chosen:
            lease.renewing = True
        # Served queues go last, so a limited caller takes the queues in turn.
        key = (queue.queue, queue.policy)
        self._by_queue[key] = self._by_queue.pop(key)
        return RenewalBatch(queue.queue, entries, now)

    def _top_is_due(self, queue: _QueueLeases, now: float) -> bool:
        if not queue.heap:
            return False
        return queue.heap[0][0] <= now + self._margin.seconds(queue.policy, now)

    def _pop_due(
        self, queue: _QueueLeases, now: float, enough: int | None, budget: _Budget
    ) -> None:
        """Move due leases from the heap to ``queue.due`` (or ``exhausted``), closest first.

        Stops once ``queue.due`` holds ``enough`` (None: when nothing due is left) or the
        budget is spent. Failed renewals whose retry time came are put back in the heap
        first, so they are taken in their turn by expiry.
        """
        self._end_retry_waits(queue, now, budget)
        horizon = now + self._margin.seconds(queue.policy, now)
        while queue.heap and queue.heap[0][0] <= horizon:
            if enough is not None and len(queue.due) >= enough:
                return
            if not budget.spend():
                return
            self.looked_at += 1
            _, _, lease = heapq.heappop(queue.heap)
            if not self._is_live(queue, lease):
                queue.stale -= 1
                continue
            lease.scheduled = False
            if self._renewal_length(lease, now) >= 1:
                queue.due.append(lease)
            else:
                queue.exhausted.append(lease)

    def _end_retry_waits(self, queue: _QueueLeases, now: float, budget: _Budget) -> None:
        """Move the leases whose retry time came from ``retrying`` back to the heap."""
        while queue.retrying and queue.retrying[0][0] <= now and budget.spend():
            self.looked_at += 1
            _, _, lease = heapq.heappop(queue.retrying)
            if self._is_held(queue, lease):
                self._schedule(queue, lease)

    def _closest_to_due(
        self, queue: _QueueLeases, now: float, count: int, budget: _Budget
    ) -> list[Lease]:
        """Up to ``count`` leases not due yet, closest first, that a renewal would extend."""
        closest: list[Lease] = []
        unfit: list[tuple[float, int, Lease]] = []
        while queue.heap and len(closest) < count and budget.spend():
            self.looked_at += 1
            entry = heapq.heappop(queue.heap)
            lease = entry[2]
            if not self._is_live(queue, lease):
                queue.stale -= 1
            elif self._renewal_length(lease, now) >= 1:
                lease.scheduled = False
                closest.append(lease)
            else:
                unfit.append(entry)
        for entry in unfit:
            heapq.heappush(queue.heap, entry)
        return closest

    @staticmethod
    def _is_held(queue: _QueueLeases, lease: Lease) -> bool:
        return id(lease) in queue.leases

    @staticmethod
    def _is_live(queue: _QueueLeases, lease: Lease) -> bool:
        return lease.scheduled and id(lease) in queue.leases

    def _schedule(self, queue: _QueueLeases, lease: Lease) -> None:
        lease.scheduled = True
        heapq.heappush(queue.heap, (lease.expires_at, next(self._sequence), lease))

    @staticmethod
    def _renewal_length(lease: Lease, now: float) -> int:
        return lease.capped_visibility(lease.policy.visibility_timeout, now, lease.hold_deadline)

    def discard(self, lease: Lease) -> None:
        """Forget ``lease``; its heap entry, if it has one, becomes stale.

        A due or exhausted lease is skipped when its list comes up, so an ack never
        searches those lists.
        """
        key = (lease.queue, lease.policy)
        queue = self._by_queue.get(key)
        if queue is None or queue.leases.pop(id(lease), None) is None:
            return
        if lease.scheduled:
            lease.scheduled = False
            queue.stale += 1
        if not queue.leases:
            del self._by_queue[key]
        elif queue.stale > len(queue.leases):
            self._rebuild(queue)

    def _rebuild(self, queue: _QueueLeases) -> None:
        """Drop the stale entries: O(n), once per n ends at most, so O(1) per end."""
        queue.heap = [entry for entry in queue.heap if self._is_live(queue, entry[2])]
        heapq.heapify(queue.heap)
        queue.stale = 0
