"""The receive's park step: tasks whose ETA is far away are hidden again in SQS.

A parked message's lease, born at the receive, ends at once: the message is hidden again
by a visibility change that waits in the manager's outbox with the acks and releases
(for up to half its receive's lease, ten to a ``ChangeMessageVisibilityBatch`` call),
and then nothing of it is left in the worker. What to park, and for how long, is
:mod:`celery_sqs_heartbeat.receiving.parking`'s decision; this module acts on it.

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
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from celery.utils.log import get_logger

from ..aws.sqs_facts import is_fifo
from ..aws.sqs_queue import FreshCopy, SQSQueue
from ..leasing.leases import EntryResult, Lease, LeasePolicy
from ..leasing.manager import VisibilityExtensionManager
from ..leasing.reporting import PARKED_REASON
from ..options import HeartbeatOptions
from .parking import PARK_WAIT_SHARE, ParkingPolicy, copy_attributes, read_due
from .steps import Received

__all__ = ["Parker"]

logger = get_logger(__name__)

WallClock = Callable[[], float]


class Parker:
    """Parks one channel's far-ETA tasks; remembers each queue's redrive policy."""

    def __init__(
        self,
        options: HeartbeatOptions,
        manager: VisibilityExtensionManager,
        lease_policy: LeasePolicy,
        wall_clock: WallClock = time.time,
    ) -> None:
        self.options = options
        self.manager = manager
        self.lease_policy = lease_policy
        #: ETAs are wall-clock instants, which every worker must read the same way.
        self._wall_clock = wall_clock
        #: Whether each queue has a redrive policy, by URL, read at its first copy.
        self._redrive: dict[str, bool] = {}

    def park(self, batch: list[Received], queue: SQSQueue) -> tuple[list[Received], int]:
        """The messages to deliver, and how many were parked until near their ETA."""
        if not self.options.eta_parking:
            return batch, 0
        policy = ParkingPolicy(self.options.eta_parking_threshold, self.lease_policy.hold_limit)
        now = self._wall_clock()
        wait = self.options.visibility_timeout * PARK_WAIT_SHARE
        staying: list[Received] = []
        parked: list[tuple[Lease, int]] = []
        copies: list[FreshCopy] = []
        for received in batch:
            lease = received.lease
            due = read_due(received.message.get("Body") or "") if lease else None
            hide = policy.hide_for(due, now, wait)
            if lease is None or due is None or hide is None:
                staying.append(received)
                continue
            copy = policy.fresh_copy_delay(due, hide, lease.receive_count, now)
            if copy is not None and not self._counts_receives(queue):
                copy = None
            lease.task_id, lease.task_name = due.task_id, due.task_name
            if copy is None:
                parked.append((lease, hide))
            else:
                copies.append((lease, *_as_sent(received), copy))
            logger.info(
                "Parking %s in SQS for %d s%s: its ETA is %.0f s away",
                lease.describe(),
                hide if copy is None else copy,
                "" if copy is None else f" as a fresh copy (receive {lease.receive_count})",
                (due.eta or now) - now,
            )
        if parked:
            self.manager.release(parked, PARKED_REASON, wait)
        if copies:
            _start(self._send_fresh_copies, queue, copies)
        return staying, len(parked) + len(copies)

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

    def _send_fresh_copies(self, queue: SQSQueue, copies: list[FreshCopy]) -> None:
        """Send the copies; delete each original only once SQS confirmed its copy.

        An original whose copy failed is parked as it is instead, to be copied at its
        next receive. Until then its lease, born at the receive, is renewed. A copy
        carries the original's S3 pointer, so the original's delete leaves the object.
        """
        results = queue.send_copies(copies)
        wait = self.options.ack_batch_interval
        for lease, _, _, delay in copies:
            outcome, reason = results.get(lease, (EntryResult.TRANSIENT, "no answer"))
            if outcome is EntryResult.OK:
                lease.copied = True
                self.manager.delete(lease, wait)
            else:
                logger.warning(
                    "Could not send a fresh copy of parked task %s (%s); parked as it is",
                    lease.describe(),
                    reason,
                )
                self.manager.release([(lease, delay)], PARKED_REASON, wait)


def _as_sent(received: Received) -> tuple[str, dict[str, dict[str, Any]]]:
    """The body and attributes of a fresh copy: the original's as SQS holds it.

    A body read from S3 goes out as the pointer it was received as, not as the body,
    which may be over SQS's limit (:func:`~celery_sqs_heartbeat.receiving.parking.copy_attributes`).
    """
    body = received.message.get("Body") or ""
    attributes = received.message.get("MessageAttributes") or {}
    return received.sent_body, copy_attributes(received.sent_body, body, attributes)


def _start(target: Callable[..., None], *args: Any) -> None:
    """SendMessageBatch off the receive loop's thread (a greenlet under gevent)."""
    threading.Thread(target=target, args=args, name="sqs-park-copies", daemon=True).start()
