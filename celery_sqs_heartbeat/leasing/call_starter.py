"""The lease manager's check: take what is due and start its SQS calls, never waiting.

Apart from the manager's public face because it runs on the manager's thread, not on
callers': it takes due renewals from the book and due deletes and releases from the
outbox, a few calls' worth per hold of the lock (:data:`BATCHES_PER_HOLD`), and starts
each call on a thread of its own within its kind's budget of call slots, so a slow
delete holds back no renewal, and a slow renewal no delete. A call that comes back is
handed to :class:`~celery_sqs_heartbeat.leasing.call_answers.AnswerSettler`.
"""

from __future__ import annotations

import functools
import logging
from typing import cast

from ..aws.calls import CallSlots
from ..aws.clients import MAX_CALLS_IN_FLIGHT, MAX_SENDS_IN_FLIGHT
from .call_answers import AnswerSettler
from .lease_calls import LeaseQueue, ask
from .leases import Lease
from .manager_state import ManagerState
from .outbox import OutboxBatch, Request
from .schedule import LOOKS_PER_BATCH, RenewalBatch

__all__ = ["BATCHES_PER_HOLD", "CallStarter"]

#: Renewal calls a check takes from the book per hold of the lock: taking each looks at no
#: more than :data:`~celery_sqs_heartbeat.leasing.schedule.LOOKS_PER_BATCH` leases, and looking
#: for exhausted ones as many again, so a hold looks at 200 at most: well under a
#: millisecond at 120,000 leases held (benchmarks/scheduler_cost.py).
BATCHES_PER_HOLD = 5


class CallStarter:
    """Starts the due renewals, then the due deletes and releases, while slots are free."""

    def __init__(self, state: ManagerState, answers: AnswerSettler, logger: logging.Logger) -> None:
        self._state = state
        self._answers = answers
        self._logger = logger
        self.renewals = CallSlots("renewal", MAX_CALLS_IN_FLIGHT, self._slot_freed)
        self.sends = CallSlots("send", MAX_SENDS_IN_FLIGHT, self._slot_freed)
        #: A check left due work behind for want of a call slot: a freed slot wakes it.
        self._starved = False
        #: Outbox calls whose answers are not reported yet; read under the lock.
        self.sends_unreported = 0

    def check(self, wait: bool) -> None:
        """Start the renewals that are due, then the deletes and releases that are due.

        The manager's thread does not wait for SQS. With ``wait`` (tests, and anyone
        calling this by hand) it takes every due call however long slots take to free,
        and returns once SQS answered them all: renewals first, so deletes held while
        their lease was being renewed go out in the same check.
        """
        while self._start_renewals() and wait:
            self.renewals.wait_for_a_slot()
        if wait:
            self.renewals.wait_until_idle()
        while self._start_sends() and wait:
            self.sends.wait_for_a_slot()
        if wait:
            self.sends.wait_until_idle()
        self._state.report.log_summary_if_due()

    def _start_renewals(self) -> bool:
        """Take due leases a few calls per hold of the lock, starting each call at once.

        Calls are taken only while a slot is free, so a lease waits in the book, not in
        a queue of calls: it is sent with its renewal length worked out at sending time.
        Returns whether due leases were left for want of a slot.
        """
        state = self._state
        started = state.clock()
        while True:
            with state.lock:
                now = state.clock()
                room = min(self.renewals.free, BATCHES_PER_HOLD)
                more = state.book.has_due(now)
                if room <= 0:
                    self._starved = self._starved or more
                    return more
                batches = state.book.due_batches(now, limit=room)
                exhausted = state.book.take_exhausted(now, limit=room * LOOKS_PER_BATCH)
                more = state.book.has_due(now)
                state.report.leases_held(len(state.book))
                for batch in batches:
                    state.report.renewal_call(batch)
            for lease in exhausted:
                state.report.capped(lease)
            for batch in batches:
                self.renewals.start(functools.partial(self._renew, batch, started))
            if not more:
                return False

    def _renew(self, batch: RenewalBatch, check_started: float) -> None:
        """One renewal call, on its own thread, and its settlement."""
        queue = cast(LeaseQueue, batch.queue)
        leases = [lease for lease, _ in batch.entries]
        call = functools.partial(queue.change_visibility, batch.entries)
        results = ask(queue, "Renewing SQS leases", leases, call, self._logger)
        self._answers.renewal_answered(batch, results, check_started)

    def _start_sends(self) -> bool:
        """Start the outbox's due calls while slots are free; whether any were left.

        A lease whose delete goes out is still renewed until SQS answers: a slow delete
        must not outlast it.
        """
        state = self._state
        with state.lock:
            room = self.sends.free
            batches = state.outbox.due_batches(state.clock(), room)
            for batch in batches:
                if batch.request is Request.DELETE:
                    for item in batch.entries:
                        state.book.suspend(item.lease)
            self.sends_unreported += len(batches)
            left = state.outbox.next_due()
            more = left is not None and left <= state.clock() and len(batches) >= room
            self._starved = self._starved or more
        for batch in batches:
            self.sends.start(functools.partial(self._send, batch))
        return more

    def _send(self, batch: OutboxBatch) -> None:
        """One delete or release call, on its own thread; unreported for ``flush`` till settled."""
        state = self._state
        queue = cast(LeaseQueue, batch.queue)
        leases = [item.lease for item in batch.entries]
        try:
            if batch.request is Request.DELETE:
                call = functools.partial(queue.delete, leases)
            else:
                entries = self._capped_releases(batch, state.clock())
                call = functools.partial(queue.change_visibility, entries)
            activity = f"Sending SQS {batch.request.value}s"
            results = ask(queue, activity, leases, call, self._logger)
            self._answers.send_answered(batch, results)
        finally:
            with state.lock:
                self.sends_unreported -= 1
                state.changed.notify_all()

    def _capped_releases(self, batch: OutboxBatch, now: float) -> list[tuple[Lease, int]]:
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
            self._logger.info(
                "Shortened SQS visibility to end within 12 hours of the receive: %s",
                ", ".join(shortened),
            )
        return [(item.lease, item.delay) for item in batch.entries]

    def _slot_freed(self) -> None:
        """A call came back: wake the thread if a check left due work for want of a slot."""
        with self._state.lock:
            if self._starved:
                self._starved = False
                self._state.changed.notify_all()
