"""The batch publisher: the process's book of messages to send, and the threads that send them.

One per process, made on first use (:mod:`celery_sqs_heartbeat.process`): up to
:data:`~celery_sqs_heartbeat.aws.clients.MAX_PUBLISH_CALLS_IN_FLIGHT` sending threads take
calls of ten out of its :class:`~celery_sqs_heartbeat.publishing.book.PublishBook`, each
through the queue's publish client. Which publishes it takes is the scopes' business
(:mod:`celery_sqs_heartbeat.publishing.scope`): a scope belongs to the thread, or
greenlet, that opened it, and to the process that opened it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from botocore.client import BaseClient
from celery.utils.log import get_logger

from ..aws.clients import MAX_PUBLISH_CALLS_IN_FLIGHT, DerivedClients
from ..aws.sqs_send import send_message_batch
from ..payloads.orphans import discard
from ..payloads.pointers import FailureStreak
from .book import PublishBatch, PublishBook, PublishSettlement, Unsent

__all__ = ["BatchPublisher", "OnConfirmed", "PublishingFailed", "SendTarget", "own_scopes"]

logger = get_logger(__name__)

#: The longest a message waits for nine others to share its call, in seconds. A
#: producer faster than that fills calls anyway; a slow one's messages still leave
#: within this, so a long scope holds few unconfirmed messages at any time.
BATCH_WAIT = 0.05

#: Messages (and bytes) a process may have waiting for a call. A publish past either
#: waits for room, so a producer far faster than SQS holds little in memory, and a
#: process that dies inside a scope has at most this many published but never sent.
MAX_WAITING = 1000
MAX_WAITING_BYTES = 64 * 1_048_576

#: Called with the task ids of each call SQS confirmed, on a sending thread.
OnConfirmed = Callable[[Sequence[str]], None]


class PublishingFailed(Exception):
    """SQS did not take some messages published in the scope; every other one it did.

    ``task_ids`` names them, in publication order, and ``reasons`` holds SQS's answer
    (or the network's) for each. None of them is in SQS, so each may be published
    again, except after "no answer" or a network error on a standard queue: SQS may
    then have taken the message without saying so, and sending it again may run the
    task twice (a FIFO queue deduplicates it, by its deduplication id, for 5 minutes).
    The S3 object of a large body is deleted before this is raised, unless SQS may hold
    its message.
    """

    def __init__(self, reasons: dict[str, str]) -> None:
        self.reasons = reasons
        self.task_ids = list(reasons)
        shown = "; ".join(f"{task_id} ({reason})" for task_id, reason in list(reasons.items())[:20])
        more = f"; and {len(reasons) - 20} more" if len(reasons) > 20 else ""
        super().__init__(f"SQS did not take {len(reasons)} message(s): {shown}{more}")


@dataclass(frozen=True)
class SendTarget:
    """Where a message goes: the client and queue URL kombu's ``_put`` chose."""

    client: BaseClient
    queue_url: str


@dataclass(eq=False)
class _Scope:
    """One ``with publishing_in_batches()``: what it still waits for, what failed."""

    on_confirmed: OnConfirmed | None
    #: The process that opened it: a child forked inside it inherits it, but not the
    #: sending threads that would settle it.
    pid: int = field(default_factory=os.getpid)
    pending: int = 0
    failed: dict[str, str] = field(default_factory=dict)


#: The scopes the current thread (or greenlet) has open, outermost first. A publish
#: belongs to its own thread's scopes or to none: another thread's ``apply_async`` (a
#: task's retry in a threads pool, a remote-control reply) promises its caller a message
#: SQS took, or an exception, and a scope of someone else's would break that. A context
#: variable, not a ``threading.local``: each gevent greenlet (greenlet 1.0 and later) has
#: a context of its own, while a thread-local made before gevent's monkey-patching is
#: shared by every greenlet of the thread.
_open_scopes: ContextVar[tuple[_Scope, ...]] = ContextVar(
    "celery_sqs_heartbeat_open_scopes", default=()
)


def own_scopes() -> tuple[_Scope, ...]:
    """This thread's open scopes that this process opened, not those a fork inherited."""
    pid = os.getpid()
    return tuple(scope for scope in _open_scopes.get() if scope.pid == pid)


class BatchPublisher:
    """The process's book of messages to send, its sending threads, and its open scopes."""

    def __init__(
        self, clients: DerivedClients, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clients = clients
        self.clock = clock
        self._book = PublishBook(batch_wait=BATCH_WAIT)
        self._lock = threading.Condition()
        self._scopes_of: dict[Unsent, tuple[_Scope, ...]] = {}
        self._senders: list[threading.Thread] = []
        self._retries = FailureStreak()

    @contextmanager
    def scope(self, on_confirmed: OnConfirmed | None = None) -> Iterator[None]:
        """A scope of the current thread; at its end, SQS's answer to all it published.

        A child forked inside it leaves it at once: the parent's scope waits for the
        parent's messages, which only the parent's sending threads settle, and the
        child's own publishes in it were never batched (:func:`active_publisher`).
        """
        opened = _Scope(on_confirmed)
        with self._lock:
            self._start_senders()
        token = _open_scopes.set((*_open_scopes.get(), opened))
        try:
            yield
        finally:
            _open_scopes.reset(token)
            failed = self._wait(opened) if opened.pid == os.getpid() else {}
        if failed:
            raise PublishingFailed(failed)

    def publish(self, item: Unsent) -> None:
        """Leave ``item`` for a call, counted by every scope the current thread has open.

        Called only where :func:`active_publisher` found one: the thread's scopes cannot
        end while it publishes.
        """
        owners = own_scopes()
        with self._lock:
            while self._book.waiting() and (
                self._book.waiting() >= MAX_WAITING
                or self._book.bytes_waiting() + item.size > MAX_WAITING_BYTES
            ):
                self._lock.wait()
            for owner in owners:
                owner.pending += 1
            self._scopes_of[item] = owners
            if self._book.add(item, self.clock()):
                self._lock.notify_all()
            self._start_senders()

    def _wait(self, scope: _Scope) -> dict[str, str]:
        """Everything ``scope`` published is sent now, and settled before this returns."""
        with self._lock:
            self._book.hurry(self.clock())
            self._lock.notify_all()
            while scope.pending:
                self._lock.wait()
        return scope.failed

    def _start_senders(self) -> None:
        """Under the lock: the sending threads, started once per process."""
        while len(self._senders) < MAX_PUBLISH_CALLS_IN_FLIGHT:
            sender = threading.Thread(
                target=self._send_forever, name="celery-sqs-heartbeat-publish", daemon=True
            )
            self._senders.append(sender)
            sender.start()

    def _send_forever(self) -> None:
        while True:
            batch = self._next_batch()
            try:
                target = batch.target
                assert isinstance(target, SendTarget)
                results = send_message_batch(
                    self._clients.publish(target.client),
                    target.queue_url,
                    [item.entry for item in batch.entries],
                )
            except Exception as exc:
                # The call's own errors are answers by now; this is a bug. The batch is
                # still settled, as a failure to retry, or its scope would wait for ever.
                logger.exception("Sending %d message(s) failed", len(batch.entries))
                results = {}
                reason = f"{type(exc).__name__} while sending"
            else:
                reason = ""
            self._settle(batch, results, reason)

    def _next_batch(self) -> PublishBatch:
        with self._lock:
            while True:
                now = self.clock()
                batch = self._book.take_batch(now)
                if batch is not None:
                    return batch
                wake = self._book.next_wake(now)
                self._lock.wait(None if wake is None else max(wake - now, 0.001))

    def _settle(self, batch: PublishBatch, results: Any, reason: str) -> None:
        with self._lock:
            settlement = self._book.settle(batch, results, self.clock())
            self._lock.notify_all()
        self._discard_orphans(batch, settlement)
        with self._lock:
            confirmed = self._account(settlement)
            self._lock.notify_all()
        self._report(settlement, reason)
        for on_confirmed, task_ids in confirmed:
            try:
                on_confirmed(task_ids)
            except Exception:
                logger.exception("on_confirmed of a batch-publishing scope failed")

    def _discard_orphans(self, batch: PublishBatch, settlement: PublishSettlement) -> None:
        """The S3 objects of entries given up, that SQS surely does not hold, deleted.

        Before the scopes hear of them, outside the lock: a producer that ends on its
        :class:`PublishingFailed` leaves no object behind, and the other sending threads
        go on meanwhile.
        """
        orphans = settlement.orphaned_objects()
        if orphans:
            target = batch.target
            assert isinstance(target, SendTarget)
            discard(partial(self._clients.s3, target.client), orphans)

    def _account(self, settlement: PublishSettlement) -> list[tuple[OnConfirmed, list[str]]]:
        """Under the lock: each scope's pending count and failures; who to tell what."""
        confirmed: dict[int, tuple[OnConfirmed, list[str]]] = {}
        for item in settlement.sent:
            for scope in self._scopes_of.pop(item):
                scope.pending -= 1
                if scope.on_confirmed is not None:
                    confirmed.setdefault(id(scope), (scope.on_confirmed, []))[1].append(
                        item.task_id
                    )
        for item, why in settlement.given_up:
            for scope in self._scopes_of.pop(item):
                scope.pending -= 1
                scope.failed[item.task_id] = why
        return list(confirmed.values())

    def _report(self, settlement: PublishSettlement, reason: str) -> None:
        if settlement.given_up:
            logger.error(
                "SQS did not take %d published message(s), given up: %s",
                len(settlement.given_up),
                "; ".join(f"{item.task_id} ({why})" for item, why in settlement.given_up),
            )
        if settlement.retried:
            with self._lock:
                first = self._retries.failed()
            if first:
                _, why = settlement.retried[0]
                logger.warning(
                    "SQS did not take %d message(s) now (%s), sending them again with a "
                    "backoff; further retries are not logged until a call succeeds",
                    len(settlement.retried),
                    reason or why,
                )
        elif settlement.sent:
            with self._lock:
                ended = self._retries.succeeded()
            if ended:
                logger.warning("SQS takes published messages again (%d calls retried)", ended)
