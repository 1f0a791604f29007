"""What one process owns, in one place: made on first use, made afresh in a forked child.

Everything here is shared by every connection and channel of the process, and by none
of another process's:

- ``metrics``: the lease counters, which the manager, the receive loop, ``celery
  inspect sqs_leases`` and the Prometheus exporter read and write;
- ``clients``: the clients derived from kombu's (renewals, receives, publishes, S3);
- ``message_limits``: each queue's ``MaximumMessageSize``, read once;
- ``s3_cleanup``: the S3 objects to delete once SQS confirms their messages' deletes;
- ``lease_queues``: where each queue's renewals go, on the live channel's client;
- ``leftovers``: the queues to remove as the process leaves;
- ``tasks_run_on_the_loop``: whether this worker's tasks run on its event loop's thread
  (the solo pool), set at Celery's ``worker_init``: its receive loop keeps one receive
  per queue (:mod:`~celery_sqs_heartbeat.startup.solo_loop`);
- ``manager`` and ``publisher``, made only when first asked for, so that a producer
  never starts the manager's thread, nor a worker the publisher's.

A forked child (a prefork pool process) starts with a new, empty state: the parent's
leases are the parent's to renew, its objects to delete, its queues to remove, and a
client made in the parent would share its sockets with the child. Its threads are gone
in the child, and a lock one of them held would be held there for ever. So the fork
hook below replaces the whole state, and nothing else in the package resets anything
at fork.

What is per connection (kombu's clients, the options, the large-payload store) lives on
the :class:`~celery_sqs_heartbeat.transport.Transport`; what is per channel (the leases it
holds, its receive loop) on the channel; what is per thread (an open
``publishing_in_batches()`` scope) in the thread's context.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from celery import signals
from celery.utils.log import get_logger

from .aws.clients import DerivedClients
from .aws.sqs_send import MessageLimits
from .leasing.lease_queues import LeaseQueues
from .leasing.manager import EXIT_FLUSH_TIMEOUT, VisibilityExtensionManager
from .monitoring.metrics import LeaseMetrics, MetricsSnapshot
from .payloads.cleanup import ObjectCleanup
from .publishing.publisher import BatchPublisher
from .queues.exit_cleanup import Leftovers
from .startup.solo_loop import runs_tasks_on_the_loop

__all__ = ["ProcessState", "snapshot", "this_process"]

logger = get_logger(__name__)


class ProcessState:
    """The state of one process; see the module's docstring for what each part is."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.metrics = LeaseMetrics()
        self.clients = DerivedClients()
        self.message_limits = MessageLimits()
        self.s3_cleanup = ObjectCleanup(self.clients)
        self.lease_queues = LeaseQueues(self.clients, self.s3_cleanup)
        self.leftovers = Leftovers()
        self.tasks_run_on_the_loop = False
        self._lock = threading.Lock()
        self._manager: VisibilityExtensionManager | None = None
        self._publisher: BatchPublisher | None = None

    @property
    def manager(self) -> VisibilityExtensionManager:
        """The lease manager, made on first use: a producer never starts its thread."""
        with self._lock:
            if self._manager is None:
                self._manager = VisibilityExtensionManager(metrics=self.metrics)
            return self._manager

    @property
    def publisher(self) -> BatchPublisher:
        """The batch publisher, made on first use (the first ``publishing_in_batches()``)."""
        with self._lock:
            if self._publisher is None:
                self._publisher = BatchPublisher(self.clients)
            return self._publisher

    def leave(self) -> None:
        """The process is leaving: what it left pending is sent, its leftover queues go.

        Deletes and releases first, within :data:`EXIT_FLUSH_TIMEOUT`: a message acked
        here must not run again. Then the S3 objects of the messages deleted, within as
        long again. A failure of any is logged, never raised.
        """
        manager = self._manager
        if manager is not None:
            left = manager.stop(EXIT_FLUSH_TIMEOUT)
            if left:
                logger.warning(
                    "%d SQS delete(s) or release(s) could not be sent before the process "
                    "ended; those messages become visible again when their leases end",
                    left,
                )
        objects_left = self.s3_cleanup.flush(EXIT_FLUSH_TIMEOUT)
        if objects_left:
            logger.warning(
                "%d S3 object(s) of deleted messages could not be deleted before the process "
                "ended; the bucket's lifecycle rule removes them",
                objects_left,
            )
        self.leftovers.remove(self.pid)


_state: ProcessState | None = None
_state_lock = threading.Lock()


def this_process() -> ProcessState:
    """The state of the calling process, made on first use."""
    global _state
    with _state_lock:
        if _state is None:
            _state = ProcessState()
        return _state


def snapshot() -> MetricsSnapshot:
    """This process's lease counters now (``from celery_sqs_heartbeat.process import snapshot``)."""
    return this_process().metrics.snapshot()


def _afresh_in_child() -> None:
    """A forked child starts with a state of its own, under a lock of its own."""
    global _state, _state_lock
    _state = None
    _state_lock = threading.Lock()


def _leave_at_exit() -> None:
    """At the interpreter's exit: the end of a script, Ctrl-C, ``sys.exit``, SIGTERM."""
    state = _state
    if state is not None and state.pid == os.getpid():
        state.leave()


def _leave_as_a_pool_child(**_: Any) -> None:
    """Celery's ``worker_process_shutdown``, sent in a prefork pool child as it leaves.

    billiard ends the child with ``os._exit`` right after, which runs no ``atexit``
    handler: a task that had called ``inspect()`` left its reply queue for good.
    """
    _leave_at_exit()


def _note_where_tasks_run(sender: Any, **_: Any) -> None:
    """Celery's ``worker_init``, sent before the worker's consumer connects: whether its
    pool runs tasks on the event loop's thread, which its channels read as they are made.
    Any other pool leaves the state untouched (a worker on another broker makes none)."""
    if runs_tasks_on_the_loop(sender.pool_cls):
        this_process().tasks_run_on_the_loop = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_afresh_in_child)
atexit.register(_leave_at_exit)
signals.worker_process_shutdown.connect(_leave_as_a_pool_child, weak=False)
signals.worker_init.connect(_note_where_tasks_run, weak=False)
