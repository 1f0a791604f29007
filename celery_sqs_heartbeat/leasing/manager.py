"""The visibility-extension manager: one per process, renewing every lease it holds.

It runs on its own thread, not on the worker's event loop: the loop is blocked while a
task runs in the solo pool and does not exist under gevent or eventlet, and a lease that
waits for the loop is a lease that expires. Under gevent the thread is a greenlet.

The thread only decides: what is due in the :class:`~celery_sqs_heartbeat.leasing.leases.LeaseBook`
(renewals) and in the :class:`~celery_sqs_heartbeat.leasing.outbox.Outbox` (deletes and
releases). Every SQS call goes out on a thread of its own (:mod:`celery_sqs_heartbeat.aws.calls`),
renewals and the outbox's calls each with their own budget of calls in flight, so no
call waits for another: a slow delete holds back no renewal, and a slow renewal no delete.

Callers (acks, rejects, receives) never wait for SQS either: they take the lock only to
update the book or the outbox. A check takes the lock for a few calls' worth of due
leases at a time (:data:`BATCHES_PER_HOLD`), so even a burst of thousands coming due
keeps every ack's wait for the lock around a millisecond.

A delete or release waits while its lease's renewal is out, so the last word is always
the one meant. A lease is still renewed while its delete is out, so that a delete SQS
applies late cannot outlast it; a renewal refused because the delete landed first is
not a loss. An acked message's lease ends when SQS confirms the delete, so a finished
task is never handed to another worker because its delete was slow or failed for a while.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from celery.utils.log import get_logger

from ..aws.calls import CallSlots
from ..aws.clients import MAX_CALLS_IN_FLIGHT, MAX_SENDS_IN_FLIGHT
from ..monitoring.metrics import LeaseMetrics
from .check_loop import CheckLoop
from .leases import LOOKS_PER_BATCH, EntryResult, Lease, LeaseBook, RenewalBatch
from .outbox import Outbox, OutboxBatch, Outgoing, Request
from .reporting import LeaseReporter

logger = get_logger(__name__)

__all__ = ["EXIT_FLUSH_TIMEOUT", "LeaseStatus", "VisibilityExtensionManager"]

Clock = Callable[[], float]
Answers = Mapping[Lease, tuple[EntryResult, str]]

#: Seconds before a delete or release that failed (throttling, 5xx, a network fault) is
#: tried again. Not sooner, so a failing SQS is not hammered when deletes go out at once.
RETRY_DELAY = 1.0

#: Renewal calls a check takes from the book per hold of the lock: taking each looks at no
#: more than :data:`~celery_sqs_heartbeat.leasing.leases.LOOKS_PER_BATCH` leases, and looking for
#: exhausted ones as many again, so a hold looks at 200 at most: well under a millisecond
#: at 120,000 leases held (benchmarks/scheduler_cost.py).
BATCHES_PER_HOLD = 5

#: How long the end of the process waits for deletes still pending: a delete that never
#: went out means the task runs again elsewhere once its lease ends. (A worker's shutdown
#: has waited already, as its channel closed: ``Settler.flush_at_close``.)
EXIT_FLUSH_TIMEOUT = 5.0


class LeaseQueue(Protocol):
    """What the manager needs of a queue: :class:`celery_sqs_heartbeat.aws.sqs_queue.SQSQueue`."""

    name: str

    def change_visibility(self, entries: Sequence[tuple[Lease, int]]) -> Answers: ...

    def delete(self, leases: Sequence[Lease]) -> Answers: ...


@dataclass(frozen=True)
class LeaseStatus:
    """One lease being renewed, as plain data: what ``inspect sqs_leases`` shows."""

    task_id: str | None
    task_name: str | None
    queue: str
    #: Seconds since the message was received.
    age: float
    renewals: int
    #: Seconds until the current lease runs out, as this process reckons it: counted
    #: from when the last renewal was sent, so SQS's own deadline is a little later.
    expires_in: float

    @classmethod
    def of(cls, lease: Lease, now: float) -> LeaseStatus:
        return cls(
            task_id=lease.task_id,
            task_name=lease.task_name,
            queue=cast(LeaseQueue, lease.queue).name,
            age=now - lease.received_at,
            renewals=lease.renewals,
            expires_in=lease.expires_at - now,
        )


class VisibilityExtensionManager:
    """Renews the leases of every channel in the process, in batches, until they end."""

    def __init__(self, clock: Clock = time.monotonic, metrics: LeaseMetrics | None = None) -> None:
        self.clock = clock
        self._book = LeaseBook()
        self._outbox = Outbox(retry_delay=RETRY_DELAY)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._report = LeaseReporter(metrics or LeaseMetrics(), clock, logger)
        self._renewals = CallSlots("renewal", MAX_CALLS_IN_FLIGHT, self._slot_freed)
        self._sends = CallSlots("send", MAX_SENDS_IN_FLIGHT, self._slot_freed)
        self._interval = float("inf")
        self._loop = CheckLoop(
            self._changed, self._sleep_time, lambda: self.check(wait=False), clock, logger
        )
        #: A check left due work behind for want of a call slot: a freed slot wakes it.
        self._starved = False
        #: Outbox calls whose answers are not reported yet.
        self._batches_reporting = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._book)

    def leases(self) -> list[LeaseStatus]:
        """The leases being renewed now, oldest first; a copy taken under the lock."""
        with self._lock:
            now = self.clock()
            statuses = [LeaseStatus.of(lease, now) for lease in self._book]
        return sorted(statuses, key=lambda status: status.age, reverse=True)

    def track(self, lease: Lease, check_interval: float) -> None:
        """Renew ``lease`` from now on; checks happen at least every ``check_interval``.

        A lease that ended (acked, released, deleted) is not renewed again.
        """
        with self._lock:
            self._book.add(lease)
            self._tracking(check_interval)
        self._ensure_thread()

    def confirm(
        self, queue: LeaseQueue, entries: Sequence[tuple[Lease, int]], check_interval: float
    ) -> Answers:
        """Renew late leases now, on the caller's thread, and track those SQS confirmed.

        The leases of an answer read late are renewed before anything else is done with
        their messages. While that renewal is out they count as being renewed: a release
        meanwhile (the channel closing) goes out once SQS answered, so that it is the
        last word, and a lease ended before or meanwhile is never tracked. Returns SQS's
        answers for the leases sent; an ended lease is not sent.
        """
        with self._lock:
            sending = [(lease, length) for lease, length in entries if self._book.confirming(lease)]
        if not sending:
            return {}
        sent_at = self.clock()
        leases = [lease for lease, _ in sending]
        call = functools.partial(queue.change_visibility, sending)
        answers = _ask(queue, "Confirming late SQS leases", leases, call)
        with self._lock:
            now = self.clock()
            for lease, length in sending:
                outcome, _ = answers.get(lease, (EntryResult.TRANSIENT, "no answer"))
                confirmed = sent_at + length if outcome is EntryResult.OK else None
                release = self._book.confirmed(lease, confirmed)
                if release is not None:
                    item = Outgoing(lease, Request.RELEASE, release.delay, release.reason)
                    self._outbox.add(item, now)
                    self._changed.notify_all()
            self._tracking(check_interval)
        self._ensure_thread()
        return answers

    def _tracking(self, check_interval: float) -> None:
        """Under the lock, after leases were added: the gauge, and checks often enough."""
        self._report.leases_held(len(self._book))
        self._interval = min(self._interval, check_interval)
        self._book.margin.interval = self._interval
        # Wake the thread only if it would sleep past the first check this lease
        # needs; a wake-up per receive would be a check per receive.
        if self._loop.sleeping_until > self.clock() + check_interval:
            self._changed.notify_all()

    def end(self, lease: Lease) -> None:
        """Stop renewing ``lease`` without telling SQS (kombu deletes the message itself)."""
        with self._lock:
            self._book.end(lease)
            self._report.leases_held(len(self._book))

    def delete(self, lease: Lease, wait: float) -> None:
        """The message is acked: delete it, renewing it until the delete goes out.

        The delete waits up to ``wait`` seconds for company in its batch call, longer while
        a renewal of its lease is on the wire or no call slot is free. The lease ends when
        SQS confirms the delete: one failing for a while leaves the message hidden.
        """
        self._send_later([Outgoing(lease, Request.DELETE)], wait)

    def redirect_delete(self, lease: Lease) -> bool:
        """If ``lease`` is a new receive of a message acked here, delete it by this receipt.

        True if its delete was pending or just confirmed: the message must not run again.
        A message copied with its S3 pointer keeps its object, by this receipt too.
        """
        with self._lock:
            replaced = self._outbox.redirect_delete(lease, self.clock())
            if replaced is None:
                return False
            self._book.end(replaced)
            lease.task_id, lease.task_name = replaced.task_id, replaced.task_name
            lease.copied = replaced.copied
            self._report.leases_held(len(self._book))
            self._wake_if_due_sooner()
        self._ensure_thread()
        return True

    def release(self, leases: Iterable[tuple[Lease, int]], reason: str, wait: float = 0) -> None:
        """Stop renewing these leases and make their messages visible after each delay.

        The release goes out within ``wait`` seconds, or once a renewal of its lease that
        is on the wire came back, so the release is always the last word.
        """
        with self._lock:
            ready = [self._book.end(lease, delay, reason) for lease, delay in leases]
            self._report.leases_held(len(self._book))
        self._send_later(
            [Outgoing(r.lease, Request.RELEASE, r.delay, r.reason) for r in ready if r], wait
        )

    def _send_later(self, items: Sequence[Outgoing], wait: float) -> None:
        if not items:
            return
        with self._lock:
            now = self.clock()
            for item in items:
                self._outbox.add(item, now + wait)
            self._report.deletes_pending(self._outbox.deletes_waiting())
            self._wake_if_due_sooner()
        self._ensure_thread()

    def _wake_if_due_sooner(self) -> None:
        """Under the lock: wake the thread if the outbox is due before it would wake."""
        next_due = self._outbox.next_due()
        if next_due is not None and next_due < self._loop.sleeping_until:
            self._changed.notify_all()

    def flush(self, timeout: float) -> int:
        """Send every pending delete and release now; wait up to ``timeout`` for SQS.

        Returns how many are still unconfirmed when ``timeout`` ran out (0: all done);
        ``flush(0)`` sends them and returns at once.
        """
        deadline = self.clock() + timeout
        with self._lock:
            if not self._unconfirmed():
                return 0
            self._outbox.hurry(self.clock())
            self._changed.notify_all()
        self._ensure_thread()
        with self._lock:
            while self._unconfirmed():
                remaining = deadline - self.clock()
                if remaining <= 0:
                    break
                self._changed.wait(min(remaining, 0.1))
            return len(self._outbox) + int(self._book.releases_waiting())

    def stop(self, timeout: float) -> int:
        """Flush, then end the thread: what is still held is no longer renewed.

        Returns how many deletes and releases were left unconfirmed, as :meth:`flush`.
        """
        left = self.flush(timeout)
        self._loop.stop(timeout)
        return left

    def _unconfirmed(self) -> bool:
        """Whether a delete or release is pending or not yet reported; under the lock."""
        return bool(self._outbox or self._batches_reporting or self._book.releases_waiting())

    def check(self, wait: bool = True) -> None:
        """Start the renewals that are due, then the deletes and releases that are due.

        The manager's thread does not wait for SQS. With ``wait`` (tests, and anyone
        calling this by hand) it takes every due call however long slots take to free,
        and returns once SQS answered them all: renewals first, so deletes held while
        their lease was being renewed go out in the same check.
        """
        while self._start_renewals() and wait:
            self._renewals.wait_for_a_slot()
        if wait:
            self._renewals.wait_until_idle()
        while self._start_sends() and wait:
            self._sends.wait_for_a_slot()
        if wait:
            self._sends.wait_until_idle()
        self._report.log_summary_if_due()

    def _start_renewals(self) -> bool:
        """Take due leases a few calls per hold of the lock, starting each call at once.

        Calls are taken only while a slot is free, so a lease waits in the book, not in
        a queue of calls: it is sent with its renewal length worked out at sending time.
        Returns whether due leases were left for want of a slot.
        """
        started = self.clock()
        while True:
            with self._lock:
                now = self.clock()
                room = min(self._renewals.free, BATCHES_PER_HOLD)
                more = self._book.has_due(now)
                if room <= 0:
                    self._starved = self._starved or more
                    return more
                batches = self._book.due_batches(now, limit=room)
                exhausted = self._book.take_exhausted(now, limit=room * LOOKS_PER_BATCH)
                more = self._book.has_due(now)
                self._report.leases_held(len(self._book))
                for batch in batches:
                    self._report.renewal_call(batch)
            for lease in exhausted:
                self._report.capped(lease)
            for batch in batches:
                self._renewals.start(functools.partial(self._renew, batch, started))
            if not more:
                return False

    def _renew(self, batch: RenewalBatch, check_started: float) -> None:
        """One renewal call, on its own thread, and its settlement."""
        queue = cast(LeaseQueue, batch.queue)
        leases = [lease for lease, _ in batch.entries]
        call = functools.partial(queue.change_visibility, batch.entries)
        results = _ask(queue, "Renewing SQS leases", leases, call)
        with self._lock:
            now = self.clock()
            self._book.margin.record_delay(now - check_started, now)
            if any(outcome is EntryResult.TRANSIENT for outcome, _ in results.values()):
                self._book.margin.record_failure(now)
            settlement = self._book.settle(batch, results, now)
            self._report.leases_held(len(self._book))
            self._report.renewal_failures(batch, results)
            for release in settlement.releases:
                item = Outgoing(release.lease, Request.RELEASE, release.delay, release.reason)
                self._outbox.add(item, now)
            if settlement.releases or self._outbox:
                # Releases, and deletes held while these leases were being renewed, can go.
                self._changed.notify_all()
        self._report.queue_health(queue, "Renewing SQS leases", results.values())
        self._report.renewed(queue, settlement)

    def _start_sends(self) -> bool:
        """Start the outbox's due calls while slots are free; whether any were left.

        A lease whose delete goes out is still renewed until SQS answers: a slow delete
        must not outlast it.
        """
        with self._lock:
            room = self._sends.free
            batches = self._outbox.due_batches(self.clock(), room)
            for batch in batches:
                if batch.request is Request.DELETE:
                    for item in batch.entries:
                        self._book.suspend(item.lease)
            self._batches_reporting += len(batches)
            left = self._outbox.next_due()
            more = left is not None and left <= self.clock() and len(batches) >= room
            self._starved = self._starved or more
        for batch in batches:
            self._sends.start(functools.partial(self._send, batch))
        return more

    def _send(self, batch: OutboxBatch) -> None:
        """One delete or release call, on its own thread; pending for :meth:`flush` till settled."""
        queue = cast(LeaseQueue, batch.queue)
        leases = [item.lease for item in batch.entries]
        try:
            if batch.request is Request.DELETE:
                call = functools.partial(queue.delete, leases)
            else:
                entries = _capped_releases(batch, self.clock())
                call = functools.partial(queue.change_visibility, entries)
            results = _ask(queue, f"Sending SQS {batch.request.value}s", leases, call)
            self._settle_send(batch, results)
        finally:
            with self._lock:
                self._batches_reporting -= 1
                self._changed.notify_all()

    def _settle_send(self, batch: OutboxBatch, results: Answers) -> None:
        """Apply SQS's answer: confirmed and hopeless deletes end their leases."""
        queue = cast(LeaseQueue, batch.queue)
        with self._lock:
            settlement = self._outbox.settle(batch, results, self.clock())
            if batch.request is Request.DELETE:
                for item, _ in settlement.retried:
                    self._book.resume(item.lease)
                for item in settlement.ended():
                    self._book.end(item.lease)
                self._report.leases_held(len(self._book))
            self._report.deletes_pending(self._outbox.deletes_waiting())
        if batch.request is Request.DELETE:
            self._report.deletes_settled(settlement)
            self._report.queue_health(queue, "Deleting acked messages", results.values())
            self._report.deletes_failed(queue, settlement)
        else:
            self._report.queue_health(queue, "Releasing messages", results.values())
            self._report.released(queue, settlement)

    def _slot_freed(self) -> None:
        """A call came back: wake the thread if a check left due work for want of a slot."""
        with self._lock:
            if self._starved:
                self._starved = False
                self._changed.notify_all()

    def _ensure_thread(self) -> None:
        self._loop.ensure_running()

    def _sleep_time(self) -> float | None:
        """How long the thread may sleep before something is owed; None: until woken.

        Leases are checked every interval; pending deletes and releases are sent when
        due, unless every send slot is taken (a freed slot wakes the thread). With
        neither, the thread sleeps for good, unless a summary is owed: without it, what
        happened since the last one (the last leases ending, a failed release) would not
        be logged until the next message arrives. The caller holds the lock.
        """
        now = self.clock()
        owed = []
        if len(self._book):
            owed.append(self._interval)
        next_due = self._outbox.next_due()
        if next_due is not None and self._sends.free:
            owed.append(next_due - now)
        summary = self._report.next_summary_in()
        if summary is not None:
            owed.append(summary)
        return max(0.0, min(owed)) if owed else None


def _capped_releases(batch: OutboxBatch, now: float) -> list[tuple[Lease, int]]:
    """A release call's entries, each delay cut to what SQS takes as it goes out at ``now``.

    Cut as the call is built, because the wait for company, a renewal on the wire or a
    retry all eat into the 12 hours after the receive. The entry keeps the delay it was
    sent with, for its retries and its ``lease_released`` signal: it is this call's alone
    until the call is settled, so no lock is needed.
    """
    shortened = []
    for item in batch.entries:
        capped = item.lease.capped_visibility(item.delay, now)
        if capped < item.delay:
            shortened.append(f"{item.lease.describe()} {item.delay} s -> {capped} s")
            item.delay = capped
    if shortened:
        logger.info(
            "Shortened SQS visibility to end within 12 hours of the receive: %s",
            ", ".join(shortened),
        )
    return [(item.lease, item.delay) for item in batch.entries]


def _ask(
    queue: LeaseQueue, activity: str, leases: Sequence[Lease], call: Callable[[], Answers]
) -> Answers:
    """SQS's answer per entry; an exception nobody foresaw counts as a failed call.

    :class:`~celery_sqs_heartbeat.aws.sqs_queue.SQSQueue` turns every error of SQS, botocore and
    the network into answers; anything else is a bug, which must not strand the leases
    as "being renewed" nor end the call's thread without settling it.
    """
    try:
        return call()
    except Exception as exc:
        logger.exception("%s on queue %s failed", activity, queue.name)
        return dict.fromkeys(leases, (EntryResult.TRANSIENT, repr(exc)))
