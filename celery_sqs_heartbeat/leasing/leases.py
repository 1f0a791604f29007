"""Leases and their margins: the typed records of the lease path. Pure, no I/O, time passed in.

A *lease* is the stretch during which SQS keeps one received message invisible. It is
born when the worker receives the message, renewed while the task is pending, and ends
at the ack, the reject, or when it is lost or reaches SQS's 12-hour limit.

Everything here is decided from the caller's clock so it can be tested without waiting,
and the caller (``manager``) holds a lock around every call: nothing here is thread-safe.
What becomes of each lease is :mod:`celery_sqs_heartbeat.leasing.book`'s job; when each held
lease comes due, :mod:`celery_sqs_heartbeat.leasing.schedule`'s.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

from ..aws.sqs_facts import SQS_MAX_HOLD_SECONDS

__all__ = ["AdaptiveMargin", "EntryResult", "Lease", "LeasePolicy", "Release"]

#: The receive is timestamped when the response has arrived, a little after SQS started
#: the clock, so every visibility change ends this much short of the 12 hours to stay valid.
HOLD_MARGIN_SECONDS = 60

#: Seconds after the receive (on this process's clock) by which every visibility change
#: must end: SQS refuses one that ends later, whether renewal, park or release.
LONGEST_HIDE = SQS_MAX_HOLD_SECONDS - HOLD_MARGIN_SECONDS

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
    leaves that to the book's :class:`AdaptiveMargin`. ``renewed`` False is a connection
    that opted out of renewals (``visibility_extension`` off): its leases are deleted or
    released, never renewed, not even while their delete is being retried.
    """

    visibility_timeout: int
    threshold: float | None = None
    max_hold: float | None = None
    renewed: bool = True

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

    def take_over(self, replaced: Lease) -> None:
        """This new receive of ``replaced``'s message carries on in its place.

        SQS hands a message out again once its lease lapsed, maybe to the worker that
        holds or acked it: what that worker knew of the message (its task, and whether a
        fresh copy shares its S3 object) now belongs to this receipt.
        """
        self.task_id, self.task_name = replaced.task_id, replaced.task_name
        self.copied = replaced.copied

    def describe(self) -> str:
        return f"task {self.task_name or '?'}[{self.task_id or '?'}]"


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
