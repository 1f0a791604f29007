"""What the lease manager does with SQS's answer to each of its calls.

Apart from the check that starts the calls because it runs elsewhere and for another
reason: on each call's own thread, once SQS answered, to apply the answer to the book
(renewed, lost, capped) or to the outbox (deleted, released, retried), then to tell the
world through the reporter (counters, signals, log lines). It takes the manager's lock
once per answer and reports after letting go, except for what must not race an ack.
"""

from __future__ import annotations

from typing import cast

from .lease_calls import Answers, LeaseQueue
from .leases import EntryResult
from .manager_state import ManagerState
from .outbox import OutboxBatch, Outgoing, Request
from .schedule import RenewalBatch

__all__ = ["AnswerSettler"]


class AnswerSettler:
    """Applies each call's answer to the manager's book or outbox, then reports it."""

    def __init__(self, state: ManagerState) -> None:
        self._state = state

    def renewal_answered(self, batch: RenewalBatch, results: Answers, check_started: float) -> None:
        """A renewal call came back: time it for the margin, settle it, report it.

        Releases that waited for these leases' renewals, and deletes held meanwhile, can
        go now: the thread is woken for them.
        """
        state = self._state
        queue = cast(LeaseQueue, batch.queue)
        with state.lock:
            now = state.clock()
            state.book.margin.record_delay(now - check_started, now)
            if any(outcome is EntryResult.TRANSIENT for outcome, _ in results.values()):
                state.book.margin.record_failure(now)
            settlement = state.book.settle(batch, results, now)
            state.report.leases_held(len(state.book))
            state.report.renewal_failures(batch, results)
            for release in settlement.releases:
                item = Outgoing(release.lease, Request.RELEASE, release.delay, release.reason)
                state.outbox.add(item, now)
            if settlement.releases or state.outbox:
                # Releases, and deletes held while these leases were being renewed, can go.
                state.changed.notify_all()
        state.report.queue_health(queue, "Renewing SQS leases", results.values())
        state.report.renewed(queue, settlement)

    def send_answered(self, batch: OutboxBatch, results: Answers) -> None:
        """Apply SQS's answer: confirmed and hopeless deletes end their leases."""
        state = self._state
        queue = cast(LeaseQueue, batch.queue)
        with state.lock:
            settlement = state.outbox.settle(batch, results, state.clock())
            if batch.request is Request.DELETE:
                for item, _ in settlement.retried:
                    state.book.resume(item.lease)
                for item in settlement.ended():
                    state.book.end(item.lease)
                state.report.leases_held(len(state.book))
            state.report.deletes_pending(state.outbox.deletes_waiting())
        if batch.request is Request.DELETE:
            state.report.deletes_settled(settlement)
            state.report.queue_health(queue, "Deleting acked messages", results.values())
            state.report.deletes_failed(queue, settlement)
        else:
            state.report.queue_health(queue, "Releasing messages", results.values())
            state.report.released(queue, settlement)
