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
from collections import deque
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum

from ..aws.sqs_facts import SQS_BATCH_SIZE, SQS_MAX_HOLD_SECONDS

__all__ = [
    "AdaptiveMargin",
    "EntryResult",
    "Lease",
    "LeaseBook",
    "LeasePolicy",
    "Release",
    "RenewalBatch",
    "Settlement",
]

#: The receive is timestamped when the response has arrived, a little after SQS started
#: the clock, so every visibility change ends this much short of the 12 hours to stay valid.
HOLD_MARGIN_SECONDS = 60

#: Seconds after the receive (on this process's clock) by which every visibility change
#: must end: SQS refuses one that ends later, whether renewal, park or release.
LONGEST_HIDE = SQS_MAX_HOLD_SECONDS - HOLD_MARGIN_SECONDS


#: Whole-call codes aside, the most leases one :meth:`LeaseBook.due_batches` call looks at
#: per call it returns: the ten it renews and up to ten more (fillers, entries of ended
#: leases). It bounds how long the caller holds its lock for each call it takes.
LOOKS_PER_BATCH = 2 * SQS_BATCH_SIZE

#: The adaptive margin's ceiling, and the fixed threshold's default before it adapted:
#: with a 1 s check, a renewal that fails is retried about nine times before the lease
#: runs out. A lease shorter than twice this uses half its visibility timeout instead.
MARGIN_CEILING = 10.0
#: Seconds a renewal should still have left when SQS answers it, on top of the check
#: interval and the measured delay: room for two retries at the next checks. The AWS .NET
#: framework renews 5 s before expiry; 4 s here (a fast SQS) makes fewer calls than its
#: rule at every load, and keeps within 1.2x the floor from 100 leases in flight
#: (benchmarks/renewal_requests.py), where 5 s would not on four queues.
MARGIN_SAFETY = 3.0
#: The margin covers this many times the slowest recent renewal delay, so a delay that
#: doubles between two measurements still lands in time.
MARGIN_LATENCY_FACTOR = 2.0
#: How long a slow or failed renewal keeps the margin wide: long enough to span a few
#: renewal rounds of a 30 s lease, short enough that a fast SQS is soon cheap again.
MARGIN_MEMORY = 60.0


@dataclass(frozen=True)
class LeasePolicy:
    """How one connection's leases are renewed; the shared manager mixes connections.

    ``threshold`` is how long before its expiry a lease is renewed; None (the default)
    leaves that to the book's :class:`AdaptiveMargin`.
    """

    visibility_timeout: int
    threshold: float | None = None
    max_hold: float | None = None

    @property
    def hold_limit(self) -> float:
        """Seconds after the receive at which renewing stops for good."""
        limit = float(LONGEST_HIDE)
        if self.max_hold is not None:
            limit = min(limit, self.max_hold)
        return limit

    @property
    def margin_ceiling(self) -> float:
        """The widest adaptive margin: today's default threshold for this lease."""
        return min(MARGIN_CEILING, self.visibility_timeout / 2)


class AdaptiveMargin:
    """How long before its expiry a lease without a fixed threshold is renewed.

    SQS bills calls, and a renewal sent ``m`` seconds before expiry buys only
    ``visibility_timeout - m`` seconds, so the margin should be as small as is safe. What
    is safe depends on how long a renewal takes to land: a lease comes due at most one
    check interval before the check that sends it, and then waits for a free call slot and
    for SQS's answer (the *delay*, measured per call from the start of its check). So the
    margin is ``interval + MARGIN_SAFETY + MARGIN_LATENCY_FACTOR x`` the slowest delay of
    the last :data:`MARGIN_MEMORY` seconds, at most :attr:`LeasePolicy.margin_ceiling`:
    a fast SQS (tens of milliseconds) renews about 4 s before expiry, a 2 s one about 8 s
    before. Until a call has been timed, and for :data:`MARGIN_MEMORY` after a call
    failed (throttling, 5xx, network), the margin is the ceiling, the old fixed default,
    so a struggling SQS gets retried many times before a lease runs out.
    """

    def __init__(self, interval: float = 1.0) -> None:
        #: The manager's check interval: a lease may come due just after a check.
        self.interval = interval
        #: ``(measured at, delay)``, delays decreasing: the window's maximum is first.
        self._slowest: deque[tuple[float, float]] = deque()
        self._last_delay: float | None = None
        self._failed_at = -math.inf

    def record_delay(self, seconds: float, now: float) -> None:
        """A renewal call answered ``seconds`` after the start of the check that sent it."""
        while self._slowest and self._slowest[-1][1] <= seconds:
            self._slowest.pop()
        self._slowest.append((now, seconds))
        self._last_delay = seconds

    def record_failure(self, now: float) -> None:
        """A renewal call failed as a whole, or for some entries, for a passing reason."""
        self._failed_at = now

    def slowest_delay(self, now: float) -> float | None:
        """The slowest recent delay; the last one if none is recent; None if never timed."""
        while self._slowest and self._slowest[0][0] < now - MARGIN_MEMORY:
            self._slowest.popleft()
        return self._slowest[0][1] if self._slowest else self._last_delay

    def seconds(self, policy: LeasePolicy, now: float) -> float:
        """The margin of ``policy``'s leases at ``now``."""
        if policy.threshold is not None:
            return policy.threshold
        delay = self.slowest_delay(now)
        if delay is None or now - self._failed_at < MARGIN_MEMORY:
            return policy.margin_ceiling
        wanted = self.interval + MARGIN_SAFETY + MARGIN_LATENCY_FACTOR * delay
        return min(policy.margin_ceiling, wanted)


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
    #: Its delete is on the wire: a renewal SQS refuses meanwhile is the delete's doing.
    deleting: bool = False
    ended: bool = False
    #: Reported lost (WARNING and ``lease_lost``): never reported twice.
    lost: bool = False
    #: A fresh copy of its message was sent with its body as SQS holds it: an S3
    #: pointer's object must outlive this message's delete, for the copy.
    copied: bool = False
    pending_release: Release | None = None
    #: Whether the lease waits in its group's heap (not due yet, not on the wire).
    scheduled: bool = False

    def __post_init__(self) -> None:
        self.expires_at = self.received_at + self.policy.visibility_timeout

    @property
    def hold_deadline(self) -> float:
        """When renewing stops: the policy's hold limit after the receive."""
        return self.received_at + self.policy.hold_limit

    def capped_visibility(self, wanted: int, now: float, until: float | None = None) -> int:
        """The visibility to send at ``now`` for ``wanted``: the guard of every change.

        SQS counts 12 hours from the receive, not from the change, and refuses a change
        that would end later (``InvalidParameterValue``, the code it also uses for a
        stale receipt handle). So renewals, parks and releases alike are cut to end by
        :data:`LONGEST_HIDE` after the receive, or by ``until`` if sooner: a renewal's
        :attr:`hold_deadline`, since ``visibility_extension_max`` bounds how long this
        worker holds a task, not how long a release hides it. Whole seconds, and never
        below 0: a release left no time makes the message visible now.
        """
        deadline = self.received_at + LONGEST_HIDE
        if until is not None:
            deadline = min(deadline, until)
        return max(0, min(wanted, math.floor(deadline - now)))

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
    #: SQS refused the visibility as ending more than 12 hours after the receive: its
    #: clock started earlier than this process's. The handle still holds the message.
    BEYOND_LIMIT = "beyond_limit"


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


class LeaseBook:
    """The leases a process is renewing, per queue, in the order they come due.

    A worker may hold SQS's in-flight limit (``SQS_MAX_IN_FLIGHT``, 120,000 a queue), and
    every ack and receive waits for the lock this book is used under. So nothing here looks
    at every lease: each queue keeps a binary heap keyed by expiry. A check with nothing due
    reads the top of each queue's heap, O(queues); one that renews k leases pops k, and at
    most nine more to fill the last call, O(k log n); an ack is O(1), leaving its heap entry
    to be skipped when it surfaces. The heap is rebuilt when stale entries outnumber live
    ones, so memory follows the leases held.

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

    A renewal that failed for a passing reason is tried again at the next check, one check
    interval (``margin.interval``) after it was sent, not at whatever check comes first:
    each queue keeps its failed leases in a second heap, by retry time, until then.
    """

    def __init__(self, margin: AdaptiveMargin | None = None) -> None:
        self.margin = margin if margin is not None else AdaptiveMargin()
        self._by_queue: dict[tuple[Hashable, LeasePolicy], _QueueLeases] = {}
        self._releases_waiting: set[Lease] = set()
        self._sequence = itertools.count()
        #: Heap entries and due leases looked at since the book was made: what bounds
        #: the time a caller holds its lock, counted for tests and benchmarks.
        self.looked_at = 0

    def __len__(self) -> int:
        return sum(len(queue.leases) for queue in self._by_queue.values())

    def __iter__(self) -> Iterator[Lease]:
        """Every lease being renewed, queue by queue (for inspection, under the lock)."""
        for queue in self._by_queue.values():
            yield from queue.leases.values()

    def add(self, lease: Lease) -> None:
        """Renew ``lease`` from now on, unless it ended: an ended lease stays ended.

        A lease may end before it is added (a late answer's, released while its
        confirmation was out), and renewing it would hide a released or deleted message
        again, for as long as the process lives.
        """
        if lease.ended:
            return
        key = (lease.queue, lease.policy)
        queue = self._by_queue.get(key)
        if queue is None:
            queue = self._by_queue[key] = _QueueLeases(lease.queue, lease.policy)
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

    def confirming(self, lease: Lease) -> bool:
        """Whether a renewal confirming ``lease`` may go out; if so, it is being renewed.

        The lease of an answer read late is confirmed before it is added. Marked as being
        renewed meanwhile, its release (the channel closing) waits for the confirmation
        to come back, as for a renewal of the book's own, so the release is the last word.
        """
        if lease.ended:
            return False
        lease.renewing = True
        return True

    def confirmed(self, lease: Lease, expires_at: float | None) -> Release | None:
        """The confirmation of ``lease`` came back, renewing it until ``expires_at``.

        None: SQS did not confirm it, and it is not added. A lease that ended meanwhile is
        not added either; the release it was waiting for, returned, can go out now.
        """
        lease.renewing = False
        if lease.ended:
            return self._take_pending_release(lease)
        if expires_at is not None:
            lease.expires_at = expires_at
            self.add(lease)
        return None

    def _take_pending_release(self, lease: Lease) -> Release | None:
        """The release that waited for a renewal of ``lease`` to come back, if any."""
        release, lease.pending_release = lease.pending_release, None
        self._releases_waiting.discard(lease)
        return release

    def suspend(self, lease: Lease) -> None:
        """Its delete is on the wire: still renewed, so that a slow delete cannot outlast it."""
        lease.deleting = True

    def resume(self, lease: Lease) -> None:
        """Renew ``lease`` again after its delete failed; due at once if it is overdue."""
        lease.deleting = False
        queue = self._by_queue.get((lease.queue, lease.policy))
        if not lease.ended and (queue is None or id(lease) not in queue.leases):
            self.add(lease)

    def releases_waiting(self) -> bool:
        """Whether a release still waits for a renewal on the wire to come back."""
        return bool(self._releases_waiting)

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
            self._discard(lease)
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
        return bool(queue.heap) and queue.heap[0][0] <= now + self.margin.seconds(queue.policy, now)

    def _pop_due(
        self, queue: _QueueLeases, now: float, enough: int | None, budget: _Budget
    ) -> None:
        """Move due leases from the heap to ``queue.due`` (or ``exhausted``), closest first.

        Stops once ``queue.due`` holds ``enough`` (None: when nothing due is left) or the
        budget is spent. Failed renewals whose retry time came are put back in the heap
        first, so they are taken in their turn by expiry.
        """
        self._end_retry_waits(queue, now, budget)
        horizon = now + self.margin.seconds(queue.policy, now)
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
                release = self._take_pending_release(lease)
                if release is not None:
                    settlement.releases.append(release)
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
            elif outcome is EntryResult.BEYOND_LIMIT:
                # At the hold limit by SQS's clock: its last renewal holds, and no more.
                self._discard(lease)
                settlement.capped.append(lease)
                continue
            elif outcome is EntryResult.LOST:
                self._discard(lease)  # while deleting: the delete landed first, no loss
                if not lease.deleting:
                    settlement.lost.append((lease, reason))
                continue
            elif now >= lease.expires_at:
                self._discard(lease)
                settlement.lost.append((lease, f"lease ran out while renewals failed: {reason}"))
                continue
            queue = self._by_queue.get((lease.queue, lease.policy))
            if queue is None or id(lease) not in queue.leases:
                continue
            if outcome is EntryResult.OK:
                self._schedule(queue, lease)
            else:
                retry_at = batch.sent_at + self.margin.interval
                heapq.heappush(queue.retrying, (retry_at, next(self._sequence), lease))
        return settlement

    def _discard(self, lease: Lease) -> None:
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
