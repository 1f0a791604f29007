"""A channel's settling of what the consumer is done with, through the manager.

An ack becomes a delete in the manager's outbox (batched, retried, the lease held until
SQS confirms it); a reject becomes a release (at once, after ``release_delay``, or after
kombu's ``backoff_policy``), so SQS's receive count and dead-letter queue keep the
retries; a message Celery will not run goes back to SQS when the channel closes. Nothing
here waits for SQS, except the close at a worker's shutdown.

The receive side, and the steps by which a lease is born, are the channel's
:class:`~celery_sqs_heartbeat.receiving.intake.Intake`'s. The channel calls in here from
its kombu hooks, handing over kombu's own step where this part goes around it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

from botocore.exceptions import BotoCoreError, ClientError
from celery.utils.log import get_logger
from kombu.transport.virtual import Channel as VirtualChannel

from ..aws.sqs_facts import is_fifo
from ..aws.sqs_queue import SQSQueue
from ..compat import backoff_policy_of
from ..leasing.leases import Lease
from .celery_requests import worker_is_stopping

if TYPE_CHECKING:
    from ..leasing.lease_table import LeaseTable
    from ..leasing.manager import VisibilityExtensionManager
    from ..options import HeartbeatOptions

__all__ = ["Settler", "SettlingPort"]

logger = get_logger(__name__)

#: How long closing a channel at a worker's shutdown waits for pending deletes and
#: releases to be confirmed.
SHUTDOWN_FLUSH_TIMEOUT = 10.0


class SettlingPort(Protocol):
    """What the settler reads of its kombu channel."""

    @property
    def qos(self) -> Any: ...

    @property
    def connection(self) -> Any: ...

    def _has_redrive_policy(self, queue: str, queue_url: str) -> Any: ...


class Settler:
    """Acks, rejects and the channel's close, through the manager's outbox.

    ``release_delay`` says how long a message released at shutdown waits, by its
    queue's URL (the receiver's ``shutdown_release_delay``).
    """

    def __init__(
        self,
        channel: SettlingPort,
        options: HeartbeatOptions,
        manager: VisibilityExtensionManager,
        lease_table: LeaseTable,
        release_delay: Callable[[str], int],
    ) -> None:
        self._channel = channel
        self.options = options
        self.manager = manager
        self.lease_table = lease_table
        self._release_delay = release_delay
        #: Tags acked by :meth:`ack_ahead` whose queued ack has not run yet; and the lock
        #: that lets exactly one of the two acks of such a message send its delete.
        self._acked_ahead: set[str] = set()
        self._ahead_lock = threading.Lock()

    def end_leases(self, delivery_tags: Iterable[str], reason: str) -> None:
        """Release unstarted messages at shutdown, or just stop renewing them."""
        leases = [lease for tag in delivery_tags if (lease := self.lease_table.let_go(tag))]
        if not leases:
            return
        if self.options.release_on_shutdown:
            self.manager.release(
                [
                    (lease, self._release_delay(cast(SQSQueue, lease.queue).url))
                    for lease in leases
                ],
                reason,
            )
        else:
            for lease in leases:
                self.manager.end(lease)

    def ack(self, delivery_tag: str, multiple: bool, kombu_ack: Callable[[str, bool], Any]) -> None:
        """Leave the delete to the manager's outbox; the lease holds until SQS confirms it.

        Returns at once, never raises: a delete that fails is retried while the lease is
        renewed, so Celery never logs "Couldn't ack" with a receipt handle, and a finished
        task is never handed to another worker because its delete failed for a while.
        """
        with self._ahead_lock:
            if delivery_tag in self._acked_ahead:
                self._acked_ahead.discard(delivery_tag)
                return  # Celery's queued ack, after the transport's: done already
            lease = self.lease_table.let_go(delivery_tag)
        self._ack_lease(delivery_tag, lease, multiple, kombu_ack)

    def ack_ahead(self, delivery_tag: str, kombu_ack: Callable[[str, bool], Any]) -> None:
        """Ack now a message whose ack Celery queued on its event loop, at a shutdown.

        A threads worker's loop does not turn while its warm shutdown waits for the
        pool: a task ending meanwhile was deleted only at the close, after the last task,
        and a SIGKILL at the end of a grace period ran it again elsewhere. Celery's own
        ack, if its loop turns again, then does nothing; if it came first, this does.
        """
        with self._ahead_lock:
            lease = self.lease_table.let_go(delivery_tag)
            if lease is None:
                return
            self._acked_ahead.add(delivery_tag)
        self._ack_lease(delivery_tag, lease, False, kombu_ack)

    def _ack_lease(
        self,
        delivery_tag: str,
        lease: Lease | None,
        multiple: bool,
        kombu_ack: Callable[[str, bool], Any],
    ) -> None:
        """The delete of an acked message: through the outbox, or kombu's own."""
        if lease is None or not self.options.ack_batching:
            if lease is not None:
                # kombu's own ack: the lease ends before its synchronous delete.
                self.manager.end(lease)
                self._point_kombu_at(delivery_tag, lease)
            kombu_ack(delivery_tag, multiple)
            return
        self.manager.delete(lease, self._batch_wait(lease))
        # kombu's virtual ack only forgets the delivery; SQS's own would delete it now.
        VirtualChannel.basic_ack(cast(Any, self._channel), delivery_tag, multiple)

    def reject(
        self, delivery_tag: str, requeue: bool, kombu_reject: Callable[[str, bool], Any]
    ) -> None:
        """Release the message to SQS instead of deleting or re-publishing it.

        SQS then counts the receive and moves the message to the dead-letter queue after
        ``maxReceiveCount``: retries are bookkept where they survive the worker. A task
        with a kombu ``backoff_policy`` is released after its backoff the same way. Any
        other reject is kombu's (a delete, through :meth:`delete_rejected`); its
        lease ends whatever that path raises, or it would be renewed for 12 hours.
        """
        lease = self.lease_table.get(delivery_tag)
        release = None if lease is None else self._release_of_reject(delivery_tag, lease, requeue)
        if lease is None or release is None:
            try:
                kombu_reject(delivery_tag, requeue)
            finally:
                left = self.lease_table.let_go(delivery_tag)
                if left is not None:
                    self.manager.end(left)
            return
        self.lease_table.let_go(delivery_tag)
        delay, reason = release
        self.manager.release([(lease, delay)], reason, self._batch_wait(lease))
        self._channel.qos.forget(delivery_tag)

    def _release_of_reject(
        self, delivery_tag: str, lease: Lease, requeue: bool
    ) -> tuple[int, str] | None:
        """How a rejected message goes back to SQS: ``(delay, reason)``; None: kombu's way."""
        backoff = backoff_policy_of(self._channel.qos, delivery_tag)
        if backoff is not None and not requeue:
            delay = backoff.get(lease.receive_count)
            return None if delay is None else (delay, "backoff")
        if requeue or self.options.release_on_failure:
            delay = self.options.release_delay_for(lease.receive_count)
            return delay, "requeue" if requeue else "failure"
        return None

    def delete_rejected(
        self, delivery_tag: str, kombu_delete: Callable[[str], Any]
    ) -> None:
        """kombu deletes a message rejected without requeue: through the outbox here."""
        lease = self.lease_table.get(delivery_tag)
        if lease is None or not self.options.ack_batching:
            if lease is not None:
                self._point_kombu_at(delivery_tag, lease)
            kombu_delete(delivery_tag)
            return
        queue = cast(SQSQueue, lease.queue)
        if self._moves_to_dead_letters(queue):
            return  # SQS moves it to the dead-letter queue after maxReceiveCount
        self.lease_table.let_go(delivery_tag)
        self.manager.delete(lease, self._batch_wait(lease))

    def _moves_to_dead_letters(self, queue: SQSQueue) -> bool:
        """kombu's check of the queue's redrive policy, also after this channel closed.

        A task's reject can run after a reconnect closed the channel that received it,
        when kombu's own check has no connection left to read through: the lease's queue
        reads it with the live connection's client. Unreadable, the message is left in
        the queue, as kombu leaves it.
        """
        if self._channel.connection is not None:
            return bool(self._channel._has_redrive_policy(queue.name, queue.url))
        try:
            return queue.has_redrive_policy()
        except (ClientError, BotoCoreError, OSError) as exc:
            logger.warning(
                "Could not read the redrive policy of SQS queue %s (%r): the rejected "
                "message is left in the queue",
                queue.name,
                exc,
            )
            return True

    def _batch_wait(self, lease: Lease) -> float:
        """How long a delete or release may wait for company in its batch call.

        A FIFO queue holds back the rest of a message group until the message is
        deleted, so its deletes go out at once (with whatever of the queue is waiting).
        """
        if is_fifo(cast(SQSQueue, lease.queue).name):
            return 0.0
        return self.options.ack_batch_interval

    def flush_at_close(self) -> None:
        """Send pending deletes and releases at once; wait for SQS only at a shutdown.

        A channel closes on the event loop at a reconnect (often because SQS is failing)
        and in a task's thread when the task closes a connection of its own: waiting
        there held the loop, or the task, for as long as SQS took, up to 10 s a flush.
        When the worker is shutting down, the channel waits up to
        :data:`SHUTDOWN_FLUSH_TIMEOUT`: a cold shutdown may end the process without the
        ``atexit`` flush, and the messages released here would stay hidden for a lease.
        """
        if not worker_is_stopping():
            self.manager.flush(0)
            return
        left = self.manager.flush(SHUTDOWN_FLUSH_TIMEOUT)
        if left:
            logger.warning(
                "%d SQS delete(s) or release(s) were not confirmed within %.0f s of closing "
                "the channel; those messages become visible again when their leases end",
                left,
                SHUTDOWN_FLUSH_TIMEOUT,
            )

    def _point_kombu_at(self, delivery_tag: str, lease: Lease) -> None:
        """Make kombu's delete use the newest receipt: SQS ignores a delete by an older one."""
        try:
            sqs_message = self._channel.qos.get(delivery_tag).delivery_info["sqs_message"]
        except KeyError:
            return
        sqs_message["ReceiptHandle"] = lease.receipt_handle
