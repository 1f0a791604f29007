"""Lease bookkeeping and renewal scheduling: pure, no I/O, time passed in.

A *lease* is the stretch during which SQS keeps one received message invisible. It is
born when the worker receives the message, renewed while the task is pending, and ends
at the ack, the reject, or when it is lost or reaches SQS's 12-hour limit.

Everything here is decided from the caller's clock so it can be tested without waiting,
and the caller (``manager``) holds a lock around every call: nothing here is thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from itertools import islice

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


class LeaseBook:
    """The leases a process is renewing, grouped by queue."""

    def __init__(self) -> None:
        self._by_queue: dict[Hashable, dict[int, Lease]] = {}
        self._releases_waiting: set[Lease] = set()

    def __len__(self) -> int:
        return sum(len(leases) for leases in self._by_queue.values())

    def __iter__(self) -> Iterator[Lease]:
        """Every lease being renewed, queue by queue (for inspection, under the lock)."""
        for leases in self._by_queue.values():
            yield from leases.values()

    def add(self, lease: Lease) -> None:
        self._by_queue.setdefault(lease.queue, {})[id(lease)] = lease

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
        exhausted = [
            lease
            for leases in self._by_queue.values()
            for lease in leases.values()
            if not lease.renewing and lease.due_at <= now and self._renewal_length(lease, now) < 1
        ]
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
        for queue, leases in self._by_queue.items():
            idle = sorted(
                (
                    lease
                    for lease in leases.values()
                    if not lease.renewing and self._renewal_length(lease, now) >= 1
                ),
                key=lambda lease: lease.due_at,
            )
            due_count = sum(1 for lease in idle if lease.due_at <= now)
            if not due_count:
                continue
            calls = math.ceil(due_count / SQS_BATCH_SIZE)
            chosen = iter(idle[: calls * SQS_BATCH_SIZE])
            while chunk := list(islice(chosen, SQS_BATCH_SIZE)):
                entries = tuple((lease, self._renewal_length(lease, now)) for lease in chunk)
                for lease, _ in entries:
                    lease.renewing = True
                batches.append(RenewalBatch(queue, entries, now))
        return batches

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
            elif outcome is EntryResult.LOST:
                self._discard(lease)
                settlement.lost.append((lease, reason))
            elif now >= lease.expires_at:
                self._discard(lease)
                settlement.lost.append((lease, f"lease ran out while renewals failed: {reason}"))
        return settlement

    def _discard(self, lease: Lease) -> None:
        leases = self._by_queue.get(lease.queue)
        if leases is None:
            return
        leases.pop(id(lease), None)
        if not leases:
            del self._by_queue[lease.queue]
