"""The visibility-extension manager: one per process, renewing every lease it holds.

It runs on its own thread, not on the worker's event loop: the loop is blocked while a
task runs in the solo pool and does not exist under gevent or eventlet, and a lease that
waits for the loop is a lease that expires. Under gevent the thread is a greenlet.

Callers (acks, rejects, receives) never wait for a renewal: they take the lock only to
update the book, and the SQS calls are made outside it. A check takes the lock for a few
calls' worth of due leases at a time (:data:`BATCHES_PER_HOLD`), so even a burst of
thousands coming due keeps every ack's wait for the lock around a millisecond.

Renewal calls go out concurrently, each on a thread of its own, at most
:data:`~celery_sqs_heartbeat.sqs.MAX_CALLS_IN_FLIGHT` at once: one after another, a slow
SQS (2 s a call) would get the tenth call of a burst out 18 s late, past the end of the
leases it carries. A thread per call, not a pool: calls are at most tens a second, a
thread costs about 0.1 ms to start, and nothing idles between bursts. Under gevent the
threads are greenlets. When no thread can be started (at interpreter shutdown) the call
is made on the checking thread. Acks and rejects leave their
delete or release in an :class:`~celery_sqs_heartbeat.outbox.Outbox`, which the same
thread sends in batches. An acked message's lease ends only when SQS confirms the
delete: until then it is renewed like any other, so a delete that fails for a while
never lets SQS hand a finished task to another worker.

Every renewal call, failed entry, lost lease and release is counted in
:mod:`celery_sqs_heartbeat.metrics`, with the time each lease had left when its renewal
went out. The thread logs those counts in one DEBUG line: at its first check that has
something to report, then every :data:`SUMMARY_INTERVAL` while leases are held or the
counts moved.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from celery.utils.log import get_logger

from . import signals
from .leases import (
    LOOKS_PER_BATCH,
    EntryResult,
    Lease,
    LeaseBook,
    RenewalBatch,
    Settlement,
)
from .metrics import LeaseMetrics, MetricsSnapshot, failure_code, process_metrics
from .outbox import Outbox, OutboxBatch, OutboxSettlement, Outgoing, Request
from .sqs import MAX_CALLS_IN_FLIGHT

logger = get_logger(__name__)

__all__ = ["SUMMARY_INTERVAL", "LeaseStatus", "VisibilityExtensionManager", "shared_manager"]

Clock = Callable[[], float]

#: Seconds between two DEBUG summaries of the lease counters. A minute is short enough
#: to follow an incident in the log, and long enough that a busy worker's log is not
#: flooded: many renewals per second still make one line a minute. The first summary
#: comes at once, so whoever turns DEBUG on sees right away that renewals run.
SUMMARY_INTERVAL = 60.0

#: Seconds before a delete or release that failed (throttling, 5xx, a network fault) is
#: tried again. Not sooner, so a failing SQS is not hammered when deletes go out at once.
RETRY_DELAY = 1.0

#: Renewal calls a check takes from the book per hold of the lock: taking each looks at no
#: more than :data:`~celery_sqs_heartbeat.leases.LOOKS_PER_BATCH` leases, and looking for
#: exhausted ones as many again, so a hold looks at 200 at most: well under a millisecond
#: at 120,000 leases held (benchmarks/scheduler_cost.py).
BATCHES_PER_HOLD = 5

#: How long a wait for a renewal call slot or answer lasts before the waiter looks again:
#: a safety net only, every answer wakes the waiters.
CALL_WAIT = 1.0

#: How long the end of the process waits for deletes still pending: a delete that never
#: went out means the task runs again elsewhere once its lease ends.
EXIT_FLUSH_TIMEOUT = 5.0


class LeaseQueue(Protocol):
    """What the manager needs of a queue: :class:`celery_sqs_heartbeat.sqs.SQSQueue`."""

    name: str

    def change_visibility(
        self, entries: Sequence[tuple[Lease, int]]
    ) -> Mapping[Lease, tuple[EntryResult, str]]: ...

    def delete(self, leases: Sequence[Lease]) -> Mapping[Lease, tuple[EntryResult, str]]: ...


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


class VisibilityExtensionManager:
    """Renews the leases of every channel in the process, in batches, until they end."""

    def __init__(self, clock: Clock = time.monotonic, metrics: LeaseMetrics | None = None) -> None:
        self.clock = clock
        self._book = LeaseBook()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        #: Notified when a renewal call came back: a slot is free.
        self._call_done = threading.Condition(self._lock)
        self._renewals_in_flight = 0
        self._health_lock = threading.Lock()
        self._interval = float("inf")
        self._thread: threading.Thread | None = None
        self._failing_queues: set[tuple[str, str]] = set()
        self._outbox = Outbox(retry_delay=RETRY_DELAY)
        self._flush_requested = False
        #: Batches taken from the outbox whose answers are not reported yet.
        self._batches_reporting = 0
        self._sleeping_until = float("inf")
        self._metrics = metrics if metrics is not None else process_metrics()
        self._next_summary_at = clock()
        self._last_summary: MetricsSnapshot = self._metrics.snapshot()

    def __len__(self) -> int:
        with self._lock:
            return len(self._book)

    def leases(self) -> list[LeaseStatus]:
        """The leases being renewed now, oldest first; a copy taken under the lock."""
        with self._lock:
            now = self.clock()
            statuses = [
                LeaseStatus(
                    task_id=lease.task_id,
                    task_name=lease.task_name,
                    queue=cast(LeaseQueue, lease.queue).name,
                    age=now - lease.received_at,
                    renewals=lease.renewals,
                    expires_in=lease.expires_at - now,
                )
                for lease in self._book
            ]
        return sorted(statuses, key=lambda status: status.age, reverse=True)

    def track(self, lease: Lease, check_interval: float) -> None:
        """Renew ``lease`` from now on; checks happen at least every ``check_interval``."""
        with self._lock:
            self._book.add(lease)
            self._count_held()
            self._interval = min(self._interval, check_interval)
            self._book.margin.interval = self._interval
            # Wake the thread only if it would sleep past the first check this lease
            # needs; a wake-up per receive would be a check per receive.
            if self._sleeping_until > self.clock() + check_interval:
                self._changed.notify_all()
        self._ensure_thread()

    def end(self, lease: Lease) -> None:
        """Stop renewing ``lease`` without telling SQS (kombu deletes the message itself)."""
        with self._lock:
            self._book.end(lease)
            self._count_held()

    def delete(self, lease: Lease, wait: float) -> None:
        """The message is acked: delete it within ``wait`` seconds, renewing it until then.

        The lease ends when SQS confirms the delete, so a delete that fails for a while
        leaves the message hidden, not handed to another worker.
        """
        self._send_later([Outgoing(lease, Request.DELETE)], wait)

    def redirect_delete(self, lease: Lease) -> bool:
        """If ``lease`` is a new receive of a message acked here, delete it by this receipt.

        True if a delete of that message was pending: the message must not run again.
        """
        with self._lock:
            replaced = self._outbox.redirect_delete(lease)
            if replaced is None:
                return False
            self._book.end(replaced)
            lease.task_id, lease.task_name = replaced.task_id, replaced.task_name
            self._count_held()
        return True

    def release(self, leases: Iterable[tuple[Lease, int]], reason: str, wait: float = 0) -> None:
        """Stop renewing these leases and make their messages visible after each delay.

        The release goes out within ``wait`` seconds, from the manager's thread. If a
        renewal of the lease is on the wire, the release waits for it to come back, so
        the release is always the last word.
        """
        with self._lock:
            ready = [self._book.end(lease, delay, reason) for lease, delay in leases]
            self._count_held()
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
            self._count_pending()
            next_due = self._outbox.next_due()
            if next_due is not None and next_due < self._sleeping_until:
                self._changed.notify_all()
        self._ensure_thread()

    def flush(self, timeout: float) -> int:
        """Send every pending delete and release now; wait for SQS's answers.

        Returns how many are still unconfirmed when ``timeout`` ran out (0: all done).
        """
        deadline = self.clock() + timeout
        with self._lock:
            if not self._unconfirmed():
                return 0
            self._flush_requested = True
            self._changed.notify_all()
        self._ensure_thread()
        with self._lock:
            while self._unconfirmed():
                remaining = deadline - self.clock()
                if remaining <= 0:
                    break
                self._changed.wait(min(remaining, 0.1))
            self._flush_requested = False
            return len(self._outbox) + int(self._book.releases_waiting())

    def _unconfirmed(self) -> bool:
        """Whether a delete or release is pending or not yet reported; under the lock."""
        return bool(self._outbox or self._batches_reporting or self._book.releases_waiting())

    def check(self, wait: bool = True) -> None:
        """Renew what is due now, then send the deletes and releases that are due.

        Renewal calls go out concurrently. With ``wait`` (tests, and anyone calling this
        by hand) it returns once SQS answered them all; the manager's thread does not
        wait, so a slow SQS delays neither its next check nor the deletes.
        """
        self._renew_due()
        if wait:
            self._wait_for_renewals()
        self._send_outbox()
        self._log_summary_if_due()

    def _renew_due(self) -> None:
        """Take the due leases a few calls at a time, sending each call as it is taken.

        Calls are taken only when a slot is free, so a lease waits in the book, not in a
        queue of calls: it is sent with its renewal length worked out at sending time.
        """
        started = self.clock()
        more = True
        while more:
            with self._lock:
                while self._renewals_in_flight >= MAX_CALLS_IN_FLIGHT:
                    self._call_done.wait(CALL_WAIT)
                now = self.clock()
                room = min(MAX_CALLS_IN_FLIGHT - self._renewals_in_flight, BATCHES_PER_HOLD)
                batches = self._book.due_batches(now, limit=room)
                exhausted = self._book.take_exhausted(now, limit=room * LOOKS_PER_BATCH)
                more = self._book.has_due(now)
                self._renewals_in_flight += len(batches)
                self._count_held()
                for batch in batches:
                    self._count_renewal_call(batch)
            for lease in exhausted:
                self._warn_capped(lease)
            for batch in batches:
                self._start_call(functools.partial(self._renew, batch, started))

    def _wait_for_renewals(self) -> None:
        with self._lock:
            while self._renewals_in_flight:
                self._call_done.wait(CALL_WAIT)

    @staticmethod
    def _start_call(call: Callable[[], None]) -> None:
        """Run ``call`` on a thread of its own, or here if no thread can be started."""
        thread = threading.Thread(target=call, name="celery-sqs-heartbeat-renewal", daemon=True)
        try:
            thread.start()
        except RuntimeError:
            call()

    def _renew(self, batch: RenewalBatch, check_started: float) -> None:
        """One renewal call and its settlement; frees its slot however it ends."""
        queue = cast(LeaseQueue, batch.queue)
        try:
            try:
                results = queue.change_visibility(batch.entries)
            except Exception as exc:
                # An answer nobody foresaw must not strand the leases as "being renewed",
                # nor stop the other queues' batches: it counts as a failed call.
                logger.exception("Renewing SQS leases on queue %s failed", queue.name)
                failed = (EntryResult.TRANSIENT, repr(exc))
                results = {lease: failed for lease, _ in batch.entries}
            settlement = self._settle_renewal(batch, results, check_started)
            self._note_queue_health(queue, "Renewing SQS leases", results.values())
            self._report(queue, settlement)
        finally:
            with self._lock:
                self._renewals_in_flight -= 1
                self._call_done.notify_all()

    def _settle_renewal(
        self,
        batch: RenewalBatch,
        results: Mapping[Lease, tuple[EntryResult, str]],
        check_started: float,
    ) -> Settlement:
        """Apply SQS's answer, time it for the margin, queue the releases it freed."""
        with self._lock:
            now = self.clock()
            self._book.margin.record_delay(now - check_started, now)
            if any(outcome is EntryResult.TRANSIENT for outcome, _ in results.values()):
                self._book.margin.record_failure(now)
            settlement = self._book.settle(batch, results, now)
            self._count_held()
            self._count_failures(batch, results)
            for release in settlement.releases:
                self._outbox.add(
                    Outgoing(release.lease, Request.RELEASE, release.delay, release.reason), now
                )
            if settlement.releases or len(self._outbox):
                # Releases, and deletes held while these leases were being renewed, can go.
                self._changed.notify_all()
        return settlement

    def _send_outbox(self) -> None:
        """Send the deletes and releases that are due, and settle SQS's answers."""
        with self._lock:
            batches = self._outbox.due_batches(self.clock(), self._flush_requested)
            self._batches_reporting += len(batches)
        for batch in batches:
            try:
                self._send_batch(batch)
            finally:
                with self._lock:
                    self._batches_reporting -= 1
                    self._changed.notify_all()

    def _send_batch(self, batch: OutboxBatch) -> None:
        """One call; it counts as pending for :meth:`flush` until its signals are sent."""
        queue = cast(LeaseQueue, batch.queue)
        leases = [item.lease for item in batch.entries]
        try:
            if batch.request is Request.DELETE:
                results = queue.delete(leases)
            else:
                results = queue.change_visibility(
                    [(item.lease, item.delay) for item in batch.entries]
                )
        except Exception as exc:
            logger.exception("Sending SQS %ss on queue %s failed", batch.request.value, queue.name)
            results = dict.fromkeys(leases, (EntryResult.TRANSIENT, repr(exc)))
        with self._lock:
            settlement = self._outbox.settle(batch, results, self.clock())
            if batch.request is Request.DELETE:
                self._settle_deletes(settlement)
            self._count_pending()
        if batch.request is Request.DELETE:
            self._note_queue_health(queue, "Deleting acked messages", results.values())
            self._report_deletes(queue, settlement)
        else:
            self._note_queue_health(queue, "Releasing messages", results.values())
            self._report_releases(queue, settlement)

    def _settle_deletes(self, settlement: OutboxSettlement) -> None:
        """End the leases of confirmed or hopeless deletes; the caller holds the lock."""
        self._metrics.record_delete_call(len(settlement.done))
        for item in settlement.done:
            self._book.end(item.lease)
        for item, reason in [*settlement.lost, *settlement.abandoned]:
            self._book.end(item.lease)
            self._metrics.record_delete_failure(failure_code(reason), retried=False)
        for _, reason in settlement.retried:
            self._metrics.record_delete_failure(failure_code(reason), retried=True)
        self._count_held()

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._run, name="celery-sqs-heartbeat", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                timeout = self._sleep_time()
                now = self.clock()
                self._sleeping_until = float("inf") if timeout is None else now + timeout
                self._changed.wait(timeout)
                self._sleeping_until = float("-inf")
            try:
                self.check(wait=False)
            except Exception:
                # A bug must not end renewals for the whole process; log it and go on.
                logger.exception("Renewing SQS message visibility failed")

    def _sleep_time(self) -> float | None:
        """How long the thread may sleep before something is owed; None: until woken.

        Leases are checked every interval; pending deletes and releases are sent when
        due. With neither, the thread sleeps for good, unless a summary is owed: without
        it, what happened since the last one (the last leases ending, a failed release)
        would not be logged until the next message arrives. The caller holds the lock.
        """
        now = self.clock()
        owed = []
        if len(self._book):
            owed.append(self._interval)
        next_due = self._outbox.next_due(self._flush_requested)
        if next_due is not None:
            owed.append(next_due - now)
        if self._summary_owed():
            owed.append(self._next_summary_at - now)
        return max(0.0, min(owed)) if owed else None

    def _summary_owed(self) -> bool:
        if not logger.isEnabledFor(logging.DEBUG):
            return False
        current = self._metrics.snapshot()
        return bool(current.leases_held) or current != self._last_summary

    def _log_summary_if_due(self) -> None:
        """Log the counters at DEBUG once a period, while leases are held or counts moved."""
        now = self.clock()
        if now < self._next_summary_at:
            return
        self._next_summary_at = now + SUMMARY_INTERVAL
        if self._summary_owed():
            self._last_summary = self._metrics.snapshot()
            logger.debug("%s", self._last_summary.summary())

    def _count_held(self) -> None:
        """Publish the book's size; the caller holds the lock."""
        self._metrics.set_leases_held(len(self._book))

    def _count_renewal_call(self, batch: RenewalBatch) -> None:
        """Count the call, and how long each of its leases still had when it was sent."""
        self._metrics.record_renewal_call(len(batch.entries))
        for lease, _ in batch.entries:
            self._metrics.record_renewal_margin(lease.expires_at - batch.sent_at)

    def _count_failures(
        self, batch: RenewalBatch, results: Mapping[Lease, tuple[EntryResult, str]]
    ) -> None:
        """Count failed entries by error code, except for leases that ended meanwhile.

        A renewal that lands just after the ack deleted its message fails: that is the
        expected end of a race, not a problem an operator should see counted. The caller
        holds the lock, so no ack slips in between the answer and this count.
        """
        for lease, _ in batch.entries:
            outcome, reason = results.get(lease, (EntryResult.TRANSIENT, "no answer"))
            if outcome is not EntryResult.OK and not lease.ended:
                self._metrics.record_renewal_failure(failure_code(reason))

    def _report(self, queue: LeaseQueue, settlement: Settlement) -> None:
        for lease, length in settlement.renewed:
            signals.lease_renewed.send(
                sender=lease.task_name,
                task_id=lease.task_id,
                task_name=lease.task_name,
                queue=queue.name,
                visibility_timeout=length,
                renewals=lease.renewals,
            )
        for lease in settlement.capped:
            self._warn_capped(lease)
        for lease, reason in settlement.lost:
            self._lose(lease, queue, reason)

    def _lose(self, lease: Lease, queue: LeaseQueue, reason: str) -> None:
        lease.lost = True
        self._metrics.record_lease_lost()
        logger.warning(
            "Lost the SQS lease of %s on queue %s (%s); SQS may deliver it again",
            lease.describe(),
            queue.name,
            reason,
        )
        signals.lease_lost.send(
            sender=lease.task_name,
            task_id=lease.task_id,
            task_name=lease.task_name,
            queue=queue.name,
            reason=reason,
        )

    def _warn_capped(self, lease: Lease) -> None:
        logger.warning(
            "Stopped renewing the SQS lease of %s after %.0f seconds "
            "(visibility_extension_max or SQS's 12-hour limit); "
            "SQS makes it visible again in %.0f seconds",
            lease.describe(),
            lease.policy.hold_limit,
            max(0.0, lease.expires_at - self.clock()),
        )

    def _note_queue_health(
        self, queue: LeaseQueue, activity: str, results: Iterable[tuple[EntryResult, str]]
    ) -> None:
        """Log a failing queue once when it starts failing and once when it recovers."""
        failures = [reason for kind, reason in results if kind is EntryResult.TRANSIENT]
        streak = (queue.name, activity)
        with self._health_lock:  # renewal calls answer on threads of their own
            started = bool(failures) and streak not in self._failing_queues
            ended = not failures and streak in self._failing_queues
            if started:
                self._failing_queues.add(streak)
            elif ended:
                self._failing_queues.discard(streak)
        if started:
            logger.warning(
                "%s on queue %s failed, retrying while the leases hold: %s",
                activity,
                queue.name,
                failures[0],
            )
        elif ended:
            logger.info("%s on queue %s works again", activity, queue.name)

    def _report_deletes(self, queue: LeaseQueue, settlement: OutboxSettlement) -> None:
        for item, reason in [*settlement.lost, *settlement.abandoned]:
            if item.lease.lost:
                continue  # already reported when its renewal failed
            self._lose(item.lease, queue, f"its delete failed: {reason}")

    def _report_releases(self, queue: LeaseQueue, settlement: OutboxSettlement) -> None:
        self._metrics.record_released(len(settlement.done))
        for item in settlement.done:
            signals.lease_released.send(
                sender=item.lease.task_name,
                task_id=item.lease.task_id,
                task_name=item.lease.task_name,
                queue=queue.name,
                delay=item.delay,
                reason=item.reason,
            )
        for item, reason in [*settlement.lost, *settlement.abandoned]:
            # Nothing is lost: the message becomes visible when its lease ends.
            logger.warning(
                "Could not release %s on queue %s (%s); SQS makes it visible "
                "again when its lease ends",
                item.lease.describe(),
                queue.name,
                reason,
            )

    def _count_pending(self) -> None:
        """Publish how many deletes wait; the caller holds the lock."""
        self._metrics.set_deletes_pending(
            sum(1 for item in self._outbox if item.request is Request.DELETE)
        )


_shared: VisibilityExtensionManager | None = None
_shared_lock = threading.Lock()


def shared_manager() -> VisibilityExtensionManager:
    """The process's manager, created on first use so producers never start a thread."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = VisibilityExtensionManager()
        return _shared


def _flush_at_exit() -> None:
    """Send what is still pending when the process ends without closing its channel."""
    manager = _shared
    if manager is not None:
        left = manager.flush(EXIT_FLUSH_TIMEOUT)
        if left:
            logger.warning(
                "%d SQS delete(s) or release(s) could not be sent before the process ended; "
                "those messages become visible again when their leases end",
                left,
            )


atexit.register(_flush_at_exit)


def _forget_shared_manager() -> None:
    # A forked child (a prefork pool process) inherits the parent's leases but not its
    # thread; the leases are the parent's to renew, so the child starts empty.
    global _shared, _shared_lock
    _shared = None
    _shared_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_shared_manager)
