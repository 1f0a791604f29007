"""The visibility-extension manager: one per process, renewing every lease it holds.

It runs on its own thread, not on the worker's event loop: the loop is blocked while a
task runs in the solo pool and does not exist under gevent or eventlet, and a lease that
waits for the loop is a lease that expires. Under gevent the thread is a greenlet.

Callers (acks, rejects, receives) never wait for a renewal: they take the lock only to
update the book, and the SQS calls are made outside it.

Every renewal call, failed entry, lost lease and release is counted in
:mod:`celery_sqs_heartbeat.metrics`, with the time each lease had left when its renewal
went out. The thread logs those counts in one DEBUG line: at its first check that has
something to report, then every :data:`SUMMARY_INTERVAL` while leases are held or the
counts moved.
"""

from __future__ import annotations

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
    EntryResult,
    Lease,
    LeaseBook,
    Release,
    RenewalBatch,
    Settlement,
    release_batches,
)
from .metrics import LeaseMetrics, MetricsSnapshot, failure_code, process_metrics

logger = get_logger(__name__)

__all__ = ["SUMMARY_INTERVAL", "LeaseStatus", "VisibilityExtensionManager", "shared_manager"]

Clock = Callable[[], float]

#: Seconds between two DEBUG summaries of the lease counters. A minute is short enough
#: to follow an incident in the log, and long enough that a busy worker's log is not
#: flooded: many renewals per second still make one line a minute. The first summary
#: comes at once, so whoever turns DEBUG on sees right away that renewals run.
SUMMARY_INTERVAL = 60.0


class LeaseQueue(Protocol):
    """What the manager needs of a queue: :class:`celery_sqs_heartbeat.sqs.SQSQueue`."""

    name: str

    def change_visibility(
        self, entries: Sequence[tuple[Lease, int]]
    ) -> Mapping[Lease, tuple[EntryResult, str]]: ...


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
        self._interval = float("inf")
        self._thread: threading.Thread | None = None
        self._failing_queues: set[str] = set()
        self._releases_in_flight = 0
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
            self._changed.notify()
        self._ensure_thread()

    def end(self, lease: Lease) -> None:
        """Stop renewing ``lease``: its message is about to be deleted (acked)."""
        with self._lock:
            self._book.end(lease)
            self._count_held()

    def release(self, leases: Iterable[tuple[Lease, int]], reason: str) -> None:
        """Stop renewing these leases and make their messages visible after each delay.

        Releases of leases whose renewal is on the wire go out from the manager's thread
        once that renewal has come back, so the release is always the last word.
        """
        with self._lock:
            ready = [self._book.end(lease, delay, reason) for lease, delay in leases]
            self._count_held()
            self._releases_in_flight += 1
        self._send_releases([r for r in ready if r is not None])

    def wait_for_releases(self, timeout: float) -> bool:
        """Wait until no release is pending or being sent; False if ``timeout`` ran out."""
        deadline = self.clock() + timeout
        with self._lock:
            while self._releases_in_flight or self._book.releases_waiting():
                remaining = deadline - self.clock()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.1))
        return True

    def check(self) -> None:
        """Renew what is due now; the thread calls this every interval, tests call it."""
        with self._lock:
            now = self.clock()
            exhausted = self._book.take_exhausted(now)
            batches = self._book.due_batches(now)
            self._count_held()
            for batch in batches:
                self._count_renewal_call(batch)
        for lease in exhausted:
            self._warn_capped(lease)
        for batch in batches:
            queue = cast(LeaseQueue, batch.queue)
            try:
                results = queue.change_visibility(batch.entries)
            except Exception as exc:
                # An answer nobody foresaw must not strand the leases as "being renewed",
                # nor stop the other queues' batches: it counts as a failed call.
                logger.exception("Renewing SQS leases on queue %s failed", queue.name)
                failed = (EntryResult.TRANSIENT, repr(exc))
                results = {lease: failed for lease, _ in batch.entries}
            with self._lock:
                settlement = self._book.settle(batch, results, self.clock())
                self._count_held()
                self._count_failures(batch, results)
                if settlement.releases:
                    self._releases_in_flight += 1
            self._note_queue_health(queue, results.values())
            self._report(queue, settlement)
            if settlement.releases:
                self._send_releases(settlement.releases)
        self._log_summary_if_due()

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
                if len(self._book):
                    self._changed.wait(self._interval)
                else:
                    self._changed.wait(self._idle_timeout())
            try:
                self.check()
            except Exception:
                # A bug must not end renewals for the whole process; log it and go on.
                logger.exception("Renewing SQS message visibility failed")

    def _idle_timeout(self) -> float | None:
        """How long a thread without leases may sleep: for good, unless a summary is owed.

        Without it, what happened since the last summary (the last leases ending, a
        failed release) would not be logged until the next message arrives.
        """
        if not self._summary_owed():
            return None
        return max(0.0, self._next_summary_at - self.clock())

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
        self, queue: LeaseQueue, results: Iterable[tuple[EntryResult, str]]
    ) -> None:
        """Log a failing queue once when it starts failing and once when it recovers."""
        failures = [reason for kind, reason in results if kind is EntryResult.TRANSIENT]
        if failures and queue.name not in self._failing_queues:
            self._failing_queues.add(queue.name)
            logger.warning(
                "Renewing SQS leases on queue %s failed, retrying every check: %s",
                queue.name,
                failures[0],
            )
        elif not failures and queue.name in self._failing_queues:
            self._failing_queues.discard(queue.name)
            logger.info("Renewing SQS leases on queue %s works again", queue.name)

    def _send_releases(self, releases: Sequence[Release]) -> None:
        """Send releases; the caller has counted them in ``_releases_in_flight``."""
        try:
            for queue, batch in release_batches(releases):
                self._send_release_batch(cast(LeaseQueue, queue), batch)
        finally:
            with self._lock:
                self._releases_in_flight -= 1
                self._changed.notify_all()

    def _send_release_batch(self, queue: LeaseQueue, batch: Sequence[Release]) -> None:
        try:
            results = queue.change_visibility([(r.lease, r.delay) for r in batch])
        except Exception:
            logger.exception("Releasing SQS messages on queue %s failed", queue.name)
            results = {}
        for release in batch:
            outcome, detail = results.get(release.lease, (EntryResult.TRANSIENT, "no answer"))
            if outcome is EntryResult.OK:
                self._metrics.record_released(1)
                signals.lease_released.send(
                    sender=release.lease.task_name,
                    task_id=release.lease.task_id,
                    task_name=release.lease.task_name,
                    queue=queue.name,
                    delay=release.delay,
                    reason=release.reason,
                )
            else:
                # Nothing is lost: the message becomes visible when its lease ends.
                logger.warning(
                    "Could not release %s on queue %s (%s); SQS makes it visible "
                    "again when its lease ends",
                    release.lease.describe(),
                    queue.name,
                    detail,
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


def _forget_shared_manager() -> None:
    # A forked child (a prefork pool process) inherits the parent's leases but not its
    # thread; the leases are the parent's to renew, so the child starts empty.
    global _shared, _shared_lock
    _shared = None
    _shared_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_shared_manager)
