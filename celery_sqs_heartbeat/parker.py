"""The receive's first step: tasks whose ETA is far away are parked in SQS, not delivered.

A parked message never becomes a lease: it is hidden again by a visibility change that
waits in the manager's outbox with the acks and releases (for up to half its receive's
lease, ten to a ``ChangeMessageVisibilityBatch`` call), and then nothing of it is left
in the worker.
What to park, and for how long, is :mod:`celery_sqs_heartbeat.parking`'s decision.

A FIFO queue's parked message holds its message group, as a held one does: SQS gives out
no later message of the group while one is in flight, visible or not.

Every receive counts towards a queue's ``maxReceiveCount``. On a standard queue with a
dead-letter queue, a task that was received before is not hidden again but sent again as
a fresh copy (same body, so same task id and headers; SQS counts it from 1), and the
original deleted once SQS confirmed the copy. A worker that dies between the two leaves
both: the original comes back after its lease, is copied again, and the task runs twice.

"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from queue import Empty
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from celery.utils.log import get_logger

from .leases import EntryResult, Lease, LeasePolicy
from .manager import VisibilityExtensionManager
from .options import HeartbeatOptions
from .parking import PARK_WAIT_SHARE, ParkingPolicy, read_due
from .receive_loop import ReceivingChannel
from .redelivery import receive_count
from .sqs import SQSQueue
from .sqs_facts import is_fifo

__all__ = ["ParkingChannel"]

logger = get_logger(__name__)


class ParkingChannel(ReceivingChannel):
    """kombu's SQS channel that hides far-ETA tasks again at the receive."""

    options: HeartbeatOptions
    manager: VisibilityExtensionManager
    lease_policy: LeasePolicy

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Whether each queue has a redrive policy, by URL, read at its first copy.
        self._redrive: dict[str, bool] = {}
        #: Messages the receive being handled parked: it brought messages all the same.
        self._parked_by_receive = 0

    def _on_messages_ready(self, queue: str, qname: str, messages: Any) -> Any:
        """kombu polls again at once after a receive that brought messages, else only
        ``polling_interval`` later: parked messages count, or a burst of countdown tasks
        would be parked ten a second."""
        parked, self._parked_by_receive = self._parked_by_receive, 0
        return super()._on_messages_ready(queue, qname, messages) or parked

    def _get_bulk(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """The blocking receive (gevent, eventlet): one that only parked receives again.

        kombu raises Empty when a receive delivers nothing, and its transport then waits
        ``polling_interval``: the same ten a second for a burst of countdown tasks.
        """
        while True:
            self._parked_by_receive = 0
            try:
                return super()._get_bulk(queue, *args, **kwargs)
            except Empty:
                if not self._parked_by_receive:
                    raise

    def _unparked(self, received: list[dict[str, Any]], queue: SQSQueue) -> list[dict[str, Any]]:
        """The received messages to deliver; the others are parked until near their ETA."""
        if not self.options.eta_parking:
            return received
        policy = ParkingPolicy(self.options.eta_parking_threshold, self.lease_policy.hold_limit)
        now, received_at = time.time(), self.manager.clock()
        wait = self.options.visibility_timeout * PARK_WAIT_SHARE
        delivered: list[dict[str, Any]] = []
        parked: list[tuple[Lease, int]] = []
        copies: list[tuple[Lease, str, int]] = []
        for sqs_message in received:
            handle = sqs_message.get("ReceiptHandle")
            due = read_due(sqs_message.get("Body") or "") if handle else None
            hide = policy.hide_for(due, now, wait)
            count = receive_count(sqs_message.get("Attributes") or {})
            copy = policy.fresh_copy_delay(due, hide, count, now)
            if copy is not None and not self._counts_receives(queue):
                copy = None
            hide = hide if copy is None else copy
            if due is None or hide is None or not handle:
                delivered.append(sqs_message)
                continue
            lease = Lease(
                receipt_handle=handle,
                queue=queue,
                policy=self.lease_policy,
                received_at=received_at,
                task_id=due.task_id,
                task_name=due.task_name,
                message_id=sqs_message.get("MessageId"),
                receive_count=count,
            )
            if copy is None:
                parked.append((lease, hide))
            else:
                copies.append((lease, sqs_message["Body"], copy))
            logger.info(
                "Parking %s in SQS for %d s%s: its ETA is %.0f s away",
                lease.describe(),
                hide,
                "" if copy is None else f" as a fresh copy (receive {count})",
                (due.eta or now) - now,
            )
        self._parked_by_receive = len(parked) + len(copies)
        if parked:
            self.manager.release(parked, "parked", wait)
        if copies:
            _start(self._send_fresh_copies, queue, copies)
        return delivered

    def _counts_receives(self, queue: SQSQueue) -> bool:
        """Whether receives move the queue's messages to a dead-letter queue.

        FIFO queues are left out: they take no delay per message, and a copy would go to
        the back of its message group. Read once per queue and channel: a redrive policy
        added later is seen after the worker reconnects or restarts.
        """
        if is_fifo(queue.name):
            return False
        if queue.url not in self._redrive:
            try:
                self._redrive[queue.url] = queue.has_redrive_policy()
            except (ClientError, BotoCoreError, OSError) as exc:
                logger.warning(
                    "Could not read the redrive policy of SQS queue %s (%r): parked tasks "
                    "received again are sent as fresh copies, as with a dead-letter queue",
                    queue.name,
                    exc,
                )
                return True
        return self._redrive[queue.url]

    def _send_fresh_copies(self, queue: SQSQueue, copies: list[tuple[Lease, str, int]]) -> None:
        """Send the copies; delete each original only once SQS confirmed its copy.

        An original whose copy failed is parked as it is instead, to be copied at its
        next receive.
        """
        results = queue.send_copies(copies)
        wait = self.options.ack_batch_interval
        for lease, _, delay in copies:
            outcome, reason = results.get(lease, (EntryResult.TRANSIENT, "no answer"))
            if outcome is EntryResult.OK:
                self.manager.delete(lease, wait)
            else:
                logger.warning(
                    "Could not send a fresh copy of parked task %s (%s); parked as it is",
                    lease.describe(),
                    reason,
                )
                self.manager.release([(lease, delay)], "parked", wait)


def _start(target: Callable[..., None], *args: Any) -> None:
    """SendMessageBatch off the receive loop's thread (a greenlet under gevent)."""
    threading.Thread(target=target, args=args, name="sqs-park-copies", daemon=True).start()
