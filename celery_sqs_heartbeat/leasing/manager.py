"""The visibility-extension manager: one per process, renewing every lease it holds.

It runs on its own thread, not on the worker's event loop: the loop is blocked while a
task runs in the solo pool and does not exist under gevent or eventlet, and a lease that
waits for the loop is a lease that expires. Under gevent the thread is a greenlet.

The thread only decides: what is due in the :class:`~celery_sqs_heartbeat.leasing.book.LeaseBook`
(renewals) and in the :class:`~celery_sqs_heartbeat.leasing.outbox.Outbox` (deletes and
releases). Every SQS call goes out on a thread of its own (:mod:`celery_sqs_heartbeat.aws.calls`),
renewals and the outbox's calls each with their own budget of calls in flight, so no
call waits for another: a slow delete holds back no renewal, and a slow renewal no delete.

Callers (acks, rejects, receives) never wait for SQS either: they take the lock only to
update the book or the outbox. A check takes the lock for a few calls' worth of due
leases at a time (:data:`~celery_sqs_heartbeat.leasing.call_starter.BATCHES_PER_HOLD`), so
even a burst of thousands coming due keeps every ack's wait for the lock around a
millisecond.

A delete or release waits while its lease's renewal is out, so the last word is always
the one meant. A lease is still renewed while its delete is out, so that a delete SQS
applies late cannot outlast it; a renewal refused because the delete landed first is
not a loss. An acked message's lease ends when SQS confirms the delete, so a finished
task is never handed to another worker because its delete was slow or failed for a while.

This module is the manager's public face: what callers ask of it, and the thread's
life. The check that starts calls is :mod:`~celery_sqs_heartbeat.leasing.call_starter`,
what comes of their answers :mod:`~celery_sqs_heartbeat.leasing.call_answers`; who holds
the lock when is written in :mod:`~celery_sqs_heartbeat.leasing.manager_state`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from celery.utils.log import get_logger

from ..monitoring.metrics import LeaseMetrics
from .book import LeaseBook
from .call_answers import AnswerSettler
from .call_starter import CallStarter
from .check_loop import CheckLoop
from .lease_calls import Answers, LeaseQueue, ask
from .leases import EntryResult, Lease
from .manager_state import ManagerState
from .outbox import Outbox, Outgoing, Request
from .reporting import LeaseReporter

logger = get_logger(__name__)

__all__ = ["EXIT_FLUSH_TIMEOUT", "LeaseStatus", "VisibilityExtensionManager"]

Clock = Callable[[], float]

#: Seconds before a delete or release that failed (throttling, 5xx, a network fault) is
#: tried again. Not sooner, so a failing SQS is not hammered when deletes go out at once.
RETRY_DELAY = 1.0

#: How long the end of the process waits for deletes still pending: a delete that never
#: went out means the task runs again elsewhere once its lease ends. (A worker's shutdown
#: has waited already, as its channel closed: ``Settler.flush_at_close``.)
EXIT_FLUSH_TIMEOUT = 5.0


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
        lock = threading.Lock()
        self._state = ManagerState(
            book=LeaseBook(),
            outbox=Outbox(retry_delay=RETRY_DELAY),
            report=LeaseReporter(metrics or LeaseMetrics(), clock, logger),
            clock=clock,
            lock=lock,
            changed=threading.Condition(lock),
        )
        self._calls = CallStarter(self._state, AnswerSettler(self._state), logger)
        self._interval = float("inf")
        self._loop = CheckLoop(
            self._state.changed, self._sleep_time, lambda: self.check(wait=False), clock, logger
        )

    def __len__(self) -> int:
        with self._state.lock:
            return len(self._state.book)

    def leases(self) -> list[LeaseStatus]:
        """The leases being renewed now, oldest first; a copy taken under the lock."""
        with self._state.lock:
            now = self.clock()
            statuses = [LeaseStatus.of(lease, now) for lease in self._state.book]
        return sorted(statuses, key=lambda status: status.age, reverse=True)

    def track(self, lease: Lease, check_interval: float) -> None:
        """Renew ``lease`` from now on; checks happen at least every ``check_interval``.

        A lease that ended (acked, released, deleted) is not renewed again.
        """
        with self._state.lock:
            self._state.book.add(lease)
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
        state = self._state
        with state.lock:
            sending = [(lease, length) for lease, length in entries if state.book.confirming(lease)]
        if not sending:
            return {}
        sent_at = self.clock()
        leases = [lease for lease, _ in sending]
        call = functools.partial(queue.change_visibility, sending)
        answers = ask(queue, "Confirming late SQS leases", leases, call, logger)
        with state.lock:
            now = self.clock()
            for lease, length in sending:
                outcome, _ = answers.get(lease, (EntryResult.TRANSIENT, "no answer"))
                confirmed = sent_at + length if outcome is EntryResult.OK else None
                release = state.book.confirmed(lease, confirmed)
                if release is not None:
                    item = Outgoing(lease, Request.RELEASE, release.delay, release.reason)
                    state.outbox.add(item, now)
                    state.changed.notify_all()
            self._tracking(check_interval)
        self._ensure_thread()
        return answers

    def _tracking(self, check_interval: float) -> None:
        """Under the lock, after leases were added: the gauge, and checks often enough."""
        state = self._state
        state.report.leases_held(len(state.book))
        self._interval = min(self._interval, check_interval)
        state.book.margin.interval = self._interval
        # Wake the thread only if it would sleep past the first check this lease
        # needs; a wake-up per receive would be a check per receive.
        if self._loop.sleeping_until > self.clock() + check_interval:
            state.changed.notify_all()

    def end(self, lease: Lease) -> None:
        """Stop renewing ``lease`` without telling SQS (kombu deletes the message itself)."""
        with self._state.lock:
            self._state.book.end(lease)
            self._state.report.leases_held(len(self._state.book))

    def delete(self, lease: Lease, wait: float) -> None:
        """The message is acked: delete it, renewing it until the delete goes out.

        The delete waits up to ``wait`` seconds for company in its batch call, longer while
        a renewal of its lease is on the wire or no call slot is free. The lease ends when
        SQS confirms the delete: one failing for a while leaves the message hidden.
        """
        self._send_later([Outgoing(lease, Request.DELETE)], wait)

    def redirect_delete(self, lease: Lease) -> Lease | None:
        """If ``lease`` is a new receive of a message acked here, delete it by this receipt.

        Returns the lease acked, if its delete was pending or just confirmed: the message
        must not run again. A message copied with its S3 pointer keeps its object, by
        this receipt too.
        """
        state = self._state
        with state.lock:
            replaced = state.outbox.redirect_delete(lease, self.clock())
            if replaced is None:
                return None
            state.book.end(replaced)
            lease.take_over(replaced)
            state.report.leases_held(len(state.book))
            self._wake_if_due_sooner()
        self._ensure_thread()
        return replaced

    def release(self, leases: Iterable[tuple[Lease, int]], reason: str, wait: float = 0) -> None:
        """Stop renewing these leases and make their messages visible after each delay.

        The release goes out within ``wait`` seconds, or once a renewal of its lease that
        is on the wire came back, so the release is always the last word.
        """
        state = self._state
        with state.lock:
            ready = [state.book.end(lease, delay, reason) for lease, delay in leases]
            state.report.leases_held(len(state.book))
        self._send_later(
            [Outgoing(r.lease, Request.RELEASE, r.delay, r.reason) for r in ready if r], wait
        )

    def _send_later(self, items: Sequence[Outgoing], wait: float) -> None:
        if not items:
            return
        state = self._state
        with state.lock:
            now = self.clock()
            for item in items:
                state.outbox.add(item, now + wait)
            state.report.deletes_pending(state.outbox.deletes_waiting())
            self._wake_if_due_sooner()
        self._ensure_thread()

    def _wake_if_due_sooner(self) -> None:
        """Under the lock: wake the thread if the outbox is due before it would wake."""
        next_due = self._state.outbox.next_due()
        if next_due is not None and next_due < self._loop.sleeping_until:
            self._state.changed.notify_all()

    def flush(self, timeout: float) -> int:
        """Send every pending delete and release now; wait up to ``timeout`` for SQS.

        Returns how many are still unconfirmed when ``timeout`` ran out (0: all done);
        ``flush(0)`` sends them and returns at once.
        """
        state = self._state
        deadline = self.clock() + timeout
        with state.lock:
            if not self._unconfirmed():
                return 0
            state.outbox.hurry(self.clock())
            state.changed.notify_all()
        self._ensure_thread()
        with state.lock:
            while self._unconfirmed():
                remaining = deadline - self.clock()
                if remaining <= 0:
                    break
                state.changed.wait(min(remaining, 0.1))
            return len(state.outbox) + int(state.book.releases_waiting())

    def stop(self, timeout: float) -> int:
        """Flush, then end the thread: what is still held is no longer renewed.

        Returns how many deletes and releases were left unconfirmed, as :meth:`flush`.
        """
        left = self.flush(timeout)
        self._loop.stop(timeout)
        return left

    def _unconfirmed(self) -> bool:
        """Whether a delete or release is pending or not yet reported; under the lock."""
        state = self._state
        return bool(state.outbox or self._calls.sends_unreported or state.book.releases_waiting())

    def check(self, wait: bool = True) -> None:
        """Start the calls that are due (:meth:`CallStarter.check`); ``wait``: for answers too."""
        self._calls.check(wait)

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
        state = self._state
        now = self.clock()
        owed = []
        if len(state.book):
            owed.append(self._interval)
        next_due = state.outbox.next_due()
        if next_due is not None and self._calls.sends.free:
            owed.append(next_due - now)
        summary = state.report.next_summary_in()
        if summary is not None:
            owed.append(summary)
        return max(0.0, min(owed)) if owed else None
