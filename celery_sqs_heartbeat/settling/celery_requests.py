"""Which received messages Celery will still run after their channel closed: read from Celery.

When a worker's broker connection drops, Celery's consumer forgets the requests it has
not started (``Consumer.on_close``: its timer's ETA entries, rate-limit buckets, the
pool's semaphore, its reserved requests) and calls the pool's ``flush()``; then the
channel closes, and the transport releases every message Celery will not run, so that it
is received again at once. A message Celery *will* run must stay held, or it runs twice:
once here, once wherever SQS hands the released copy.

"Started" (``celery.worker.state.active_requests``) is not the answer on every pool. A
prefork pool's ``flush()`` drops what it was handed and no child accepted, so there only
started requests run. The other pools (threads, gevent, eventlet, solo) have the base
pool's ``flush()``, which does nothing: a request handed to them still runs, started or
not; the threads pool queues it in its executor, for instance. So a message is kept if
its task started, or if it was handed to a pool that keeps what it was handed.

A request on its way to the pool is Celery's timer's on a green pool (gevent, eventlet):
the timer runs each countdown in a greenlet of its own, which waits in the pool's
``spawn`` when the pool is full (the chaos soak: a countdown came due on a full gevent
pool, a dropped connection released its message, and it ran there and on the worker SQS
handed it to). Whether that greenlet still runs after the close is up to
``Consumer.on_close``, which comes after the channel closed, and differs by Celery version
(:func:`_green_timer_runs`). The event loop's timer (prefork, threads, solo) is emptied
before the close on every version, and what waits for a prefork pool's semaphore is
dropped by ``on_close``.

A task that has *ended* is settled by Celery, not run: ``Request.acknowledge`` (or
``reject``) calls the request's ``on_ack`` (``on_reject``) promise, which queues the
message's ack on the event loop (``Consumer.call_soon_ack``). A reconnect can close the
channel before that queued ack runs: a solo worker's loop, blocked by the task, fires the
overdue reconnect in the same turn. Released then, the message would be received and run
again. Nor can the channel wait for the queued ack: kombu's Hub takes a turn's queued
callbacks all at once, and when one raises (the lost connection itself), the rest of
them are dropped. So a message Celery asked to ack (:meth:`CeleryRequests.asked_to_ack`) is acked at
the close, as the queued ack would have; one it asked to reject stays held until its
reject runs.

Celery tells the transport of every request through its ``task_received`` signal (sender:
the consumer, whose ``pool`` it is). Handed to the pool means ``Request.execute_using_pool``
ran, which leaves ``Request._apply_result`` set (Celery 5.5 to 5.7); Celery has no public
word for it. A finished request is dropped by Celery before its queued ack runs, so the
requests are referenced by the channel until kombu forgets their delivery
(:meth:`CeleryRequests.forget`).

The same queued ack waits through a warm shutdown on a pool whose tasks end off the event
loop (threads): the loop no longer turns while the worker waits for the pool, so a task
ending then was deleted only at the close, after the last task, or never, if the worker
was killed at the end of its grace period. So the transport hears of Celery's asking
(``then`` on the request's ``on_ack`` promise, after the ack is queued) and, while the
worker is stopping, acks at once (:meth:`Channel.ack_for_celery`); Celery's queued ack
then does nothing. Prefork children's results and green pools' acks are settled on the
worker's loop or at once, where acking at once changes nothing.

A solo worker's queued ack waits too, always: it runs its tasks on the event loop, and
kombu hands it every message of a receive's answer in one turn, so a task's ack waited
for the next task to end (the chaos soak: a task that retried, acked behind a 12 s task,
its delete then failing in an outage past its lease, ran again elsewhere and retried
again). So on a pool whose tasks run on the event loop's thread, the channel acks as soon
as Celery asks, on that same thread.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, NamedTuple

from celery import VERSION as CELERY_VERSION
from celery.concurrency.base import BasePool
from celery.signals import task_received
from celery.utils.log import get_logger
from vine import Thenable

from ..process import this_process

__all__ = ["CeleryRequests", "worker_is_stopping"]

logger = get_logger(__name__)


class CeleryRequests:
    """The Celery requests of the messages one channel holds a lease on, by delivery tag.

    The channel's own: a delivery tag (the receipt handle of the receive that brought the
    message) is the channel's, and kombu forgets it through that channel's QoS (acked,
    rejected or released). Each request is kept with whether its pool runs what it was
    handed even after a flush, and with the timer that holds its countdown. Plain dict
    operations, atomic under the GIL: Celery's signal comes on the consumer's thread, the
    close may come on another.
    """

    def __init__(self) -> None:
        self._requests: dict[str, _Noted] = {}

    def remember(self, delivery_tag: str, request: Any, consumer: Any) -> None:
        """Celery's ``consumer`` received ``request`` for the delivery."""
        self._requests[delivery_tag] = _Noted(
            request, _keeps_what_it_was_handed(consumer.pool), getattr(consumer, "timer", None)
        )

    def forget(self, delivery_tag: str) -> None:
        """kombu forgot the delivery (acked, rejected, released): so does the channel."""
        self._requests.pop(delivery_tag, None)

    def asked_to_ack(self, delivery_tag: str) -> bool:
        """Whether Celery has asked to ack the message delivered as ``delivery_tag``.

        True once the request's ``on_ack`` promise was called: the ack itself may still
        wait on the event loop.
        """
        noted = self._requests.get(delivery_tag)
        return noted is not None and getattr(noted.request.on_ack, "ready", False) is True

    def will_run(self, delivery_tag: str, task_id: str | None) -> bool:
        """Whether Celery will still run, or reject, the message delivered as ``delivery_tag``.

        Outside a Celery worker (a plain kombu consumer), nothing will: kombu hands a
        message to its consumer only once.
        """
        if task_id is not None and task_id in _started_task_ids():
            return True
        noted = self._requests.get(delivery_tag)
        if noted is None:
            return False
        request = noted.request
        if request.acknowledged:  # settled by Celery: its ack or reject is queued
            return True
        if noted.pool_keeps and request._apply_result is not None:
            return True
        return _green_timer_runs(request, noted.timer)


class _Noted(NamedTuple):
    """A request, with what decides whether Celery still runs it after a close."""

    request: Any
    #: Its pool runs what it was handed even after a flush.
    pool_keeps: bool
    #: The consumer's timer, which holds its countdown.
    timer: Any


def _remember(sender: Any = None, request: Any = None, **_: Any) -> None:
    """Celery's ``task_received``: the request goes to the channel that delivered it.

    Only a message the channel holds a lease on is noted: kombu forgets only those
    (:meth:`CeleryRequests.forget`), and a consumer without acks (``no_ack``) would
    otherwise fill the book.
    """
    message = getattr(request, "message", None)
    tag = getattr(message, "delivery_tag", None)
    pool = getattr(sender, "pool", None)
    channel = getattr(message, "channel", None)
    lease_table = getattr(channel, "lease_table", None)
    requests = getattr(channel, "celery_requests", None)
    if not isinstance(tag, str) or pool is None or lease_table is None or requests is None:
        return
    if lease_table.get(tag) is None:
        return
    requests.remember(tag, request, sender)
    on_ack = getattr(request, "on_ack", None)
    if isinstance(on_ack, Thenable):
        on_ack.then(functools.partial(_asked_to_ack, channel, tag))


def _asked_to_ack(channel: Any, delivery_tag: str, *_: Any) -> None:
    """Celery queued the ack: the channel acks it now while the worker stops, and always
    on a pool whose tasks run on the event loop (solo).

    Runs inside Celery's ``Request.acknowledge``, in a pool's thread: it must not raise.
    """
    if not (worker_is_stopping() or this_process().tasks_run_on_the_loop):
        return
    try:
        channel.ack_for_celery(delivery_tag)
    except Exception:
        logger.exception("Acking a task as Celery asked failed")


task_received.connect(_remember, weak=False)


def _green_timer_runs(request: Any, timer: Any) -> bool:
    """Whether a greenlet of a green pool's ``timer`` still runs ``request`` after the close.

    ``Consumer.on_close`` decides, after the channel closed: Celery 5.5 clears the timer,
    killing every greenlet; 5.6 leaves them all, so a countdown not yet due runs after the
    reconnect; 5.7 cancels those of countdowns not yet due (``scheduled_requests``) and
    leaves those already due, waiting for a free slot (measured on each version by
    ``tests/integration/test_reconnect.py``).
    """
    if not _carried_by_green_timer(request, timer) or CELERY_VERSION < (5, 6):
        return False
    state = sys.modules.get("celery.worker.state")
    scheduled = getattr(state, "scheduled_requests", None)  # Celery 5.7 on
    return scheduled is None or request not in scheduled


def _carried_by_green_timer(request: Any, timer: Any) -> bool:
    """Whether one of ``timer``'s greenlets carries ``request``: its countdown, due or not.

    A green timer (``celery.concurrency.gevent``, ``.eventlet``) keeps a set of greenlets,
    each with the entry it runs, until the entry returns; the event loop's timer is a heap.
    """
    greenlets = getattr(timer, "_queue", None)
    if not isinstance(greenlets, set):
        return False
    return any(
        any(arg is request for arg in getattr(getattr(g, "entry", None), "args", ()))
        for g in list(greenlets)
    )


def _keeps_what_it_was_handed(pool: Any) -> bool:
    """Whether ``pool``'s ``flush()`` is the base pool's, which drops nothing."""
    return getattr(getattr(pool, "flush", None), "__func__", None) is BasePool.flush


def _started_task_ids() -> set[str]:
    """Ids of the tasks this worker has started and not finished."""
    state = sys.modules.get("celery.worker.state")
    if state is None:
        return set()
    return {request.id for request in list(state.active_requests)}


def worker_is_stopping() -> bool:
    """Whether this Celery worker is shutting down, warm or cold; False outside one.

    A channel that closes then waits for what it sent: a cold shutdown may end the
    process without running ``atexit``. At a reconnect, or when a task closes a connection
    of its own, nothing waits.
    """
    state = sys.modules.get("celery.worker.state")
    if state is None:
        return False
    return any(
        flag is not None and flag is not False
        for flag in (state.should_stop, state.should_terminate)
    )
