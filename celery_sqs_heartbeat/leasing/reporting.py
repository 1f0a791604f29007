"""What the manager tells the world about leases: counters, signals and log lines.

It speaks with the manager's logger, which is what operators turn up to see renewals.
Kept apart from the manager so that deciding what to renew, delete or release (under its
lock) and saying what happened (outside it, mostly) read separately. Everything here is
called from the checking thread or from a call's own thread, so the only shared state,
which queues are failing, has a lock of its own.

Every renewal call, failed entry, lost lease and release is counted in
:mod:`celery_sqs_heartbeat.monitoring.metrics`, with the time each lease had left when its renewal
went out. The counts are logged in one DEBUG line: at the first check that has
something to report, then every :data:`SUMMARY_INTERVAL` while leases are held or the
counts moved. Renewals are logged at DEBUG only; a lost lease is a WARNING, and every
message handed back to SQS (a reject, a release at shutdown) one INFO line a call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from .. import signals
from ..monitoring.metrics import LeaseMetrics, MetricsSnapshot, failure_code
from .book import Settlement
from .leases import EntryResult, Lease
from .outbox import OutboxSettlement, Outgoing
from .schedule import RenewalBatch

__all__ = ["SUMMARY_INTERVAL", "LeaseReporter"]

#: Seconds between two DEBUG summaries of the lease counters. A minute is short enough
#: to follow an incident in the log, and long enough that a busy worker's log is not
#: flooded: many renewals per second still make one line a minute. The first summary
#: comes at once, so whoever turns DEBUG on sees right away that renewals run.
SUMMARY_INTERVAL = 60.0

#: The reason :mod:`celery_sqs_heartbeat.receiving.parker` releases a far-ETA task with. The
#: parker logs each park at INFO itself, so these releases are not logged again.
PARKED_REASON = "parked"


class NamedQueue(Protocol):
    name: str


class LeaseReporter:
    """Counts, signals and logs the outcome of every renewal, delete and release."""

    def __init__(
        self, metrics: LeaseMetrics, clock: Callable[[], float], logger: logging.Logger
    ) -> None:
        self.metrics = metrics
        self._logger = logger
        self._clock = clock
        self._health_lock = threading.Lock()
        self._failing_queues: set[tuple[str, str]] = set()
        self._next_summary_at = clock()
        self._last_summary: MetricsSnapshot = metrics.snapshot()

    def leases_held(self, count: int) -> None:
        self.metrics.set_leases_held(count)

    def deletes_pending(self, count: int) -> None:
        self.metrics.set_deletes_pending(count)

    def renewal_call(self, batch: RenewalBatch) -> None:
        """Count the call, and how long each of its leases still had when it was sent."""
        self.metrics.record_renewal_call(len(batch.entries))
        for lease, _ in batch.entries:
            self.metrics.record_renewal_margin(lease.expires_at - batch.sent_at)

    def renewal_failures(
        self, batch: RenewalBatch, results: Mapping[Lease, tuple[EntryResult, str]]
    ) -> None:
        """Count failed entries by error code, except for leases that ended meanwhile.

        A renewal that lands just after the ack deleted its message fails: that is the
        expected end of a race, not a problem an operator should see counted. The caller
        holds the manager's lock, so no ack slips in between the answer and this count.
        """
        for lease, _ in batch.entries:
            outcome, reason = results.get(lease, (EntryResult.TRANSIENT, "no answer"))
            if outcome is not EntryResult.OK and not lease.ended:
                self.metrics.record_renewal_failure(failure_code(reason))

    def deletes_settled(self, settlement: OutboxSettlement) -> None:
        self.metrics.record_delete_call(len(settlement.done))
        for _, reason in [*settlement.lost, *settlement.abandoned]:
            self.metrics.record_delete_failure(failure_code(reason), retried=False)
        for _, reason in settlement.retried:
            self.metrics.record_delete_failure(failure_code(reason), retried=True)

    def renewed(self, queue: NamedQueue, settlement: Settlement) -> None:
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
            self.capped(lease)
        for lease, reason in settlement.lost:
            self.lost(lease, queue, reason)

    def lost(self, lease: Lease, queue: NamedQueue, reason: str) -> None:
        lease.lost = True
        self.metrics.record_lease_lost()
        self._logger.warning(
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

    def capped(self, lease: Lease) -> None:
        """Renewing stopped at the hold limit, by this process's clock or by SQS's refusal."""
        self._logger.warning(
            "Stopped renewing the SQS lease of %s after %.0f seconds "
            "(visibility_extension_max or SQS's 12-hour limit); "
            "SQS makes it visible again in %.0f seconds",
            lease.describe(),
            lease.policy.hold_limit,
            max(0.0, lease.expires_at - self._clock()),
        )

    def deletes_failed(self, queue: NamedQueue, settlement: OutboxSettlement) -> None:
        for item, reason in [*settlement.lost, *settlement.abandoned]:
            if item.lease.lost:
                continue  # already reported when its renewal failed
            self.lost(item.lease, queue, f"its delete failed: {reason}")

    def released(self, queue: NamedQueue, settlement: OutboxSettlement) -> None:
        self.metrics.record_released(len(settlement.done))
        for item in settlement.done:
            signals.lease_released.send(
                sender=item.lease.task_name,
                task_id=item.lease.task_id,
                task_name=item.lease.task_name,
                queue=queue.name,
                delay=item.delay,
                reason=item.reason,
            )
        self._log_released(queue, settlement.done)
        for item, reason in settlement.beyond_limit:
            self._logger.info(
                "SQS would not hide %s on queue %s past 12 hours from its receive (%s); "
                "releasing it with no delay instead",
                item.lease.describe(),
                queue.name,
                reason,
            )
        for item, reason in [*settlement.lost, *settlement.abandoned]:
            # Nothing is lost: the message becomes visible when its lease ends.
            self._logger.warning(
                "Could not release %s on queue %s (%s); SQS makes it visible "
                "again when its lease ends",
                item.lease.describe(),
                queue.name,
                reason,
            )

    def _log_released(self, queue: NamedQueue, done: Iterable[Outgoing]) -> None:
        """One INFO line a release call: a task handed back to SQS is seen at INFO.

        Parked tasks are left out: the parker logged each at INFO when it parked it.
        """
        shown = [
            f"{item.lease.describe()} ({item.reason}, visible again in {item.delay} s)"
            for item in done
            if item.reason != PARKED_REASON
        ]
        if shown:
            self._logger.info("Released to SQS on queue %s: %s", queue.name, ", ".join(shown))

    def queue_health(
        self, queue: NamedQueue, activity: str, results: Iterable[tuple[EntryResult, str]]
    ) -> None:
        """Log a failing queue once when it starts failing and once when it recovers."""
        failures = [reason for kind, reason in results if kind is EntryResult.TRANSIENT]
        streak = (queue.name, activity)
        with self._health_lock:  # calls answer on threads of their own
            started = bool(failures) and streak not in self._failing_queues
            ended = not failures and streak in self._failing_queues
            if started:
                self._failing_queues.add(streak)
            elif ended:
                self._failing_queues.discard(streak)
        if started:
            self._logger.warning(
                "%s on queue %s failed, retrying while the leases hold: %s",
                activity,
                queue.name,
                failures[0],
            )
        elif ended:
            self._logger.info("%s on queue %s works again", activity, queue.name)

    def summary_owed(self) -> bool:
        if not self._logger.isEnabledFor(logging.DEBUG):
            return False
        current = self.metrics.snapshot()
        return bool(current.leases_held) or current != self._last_summary

    def next_summary_in(self) -> float | None:
        """Seconds until a summary is owed; None while there is nothing to summarise."""
        if not self.summary_owed():
            return None
        return self._next_summary_at - self._clock()

    def log_summary_if_due(self) -> None:
        """Log the counters at DEBUG once a period, while leases are held or counts moved."""
        now = self._clock()
        if now < self._next_summary_at:
            return
        self._next_summary_at = now + SUMMARY_INTERVAL
        if self.summary_owed():
            self._last_summary = self.metrics.snapshot()
            self._logger.debug("%s", self._last_summary.summary())
