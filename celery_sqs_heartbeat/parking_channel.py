"""The receive's first step: tasks whose ETA is far away are parked in SQS, not delivered.

A parked message never becomes a lease: it is hidden again by a visibility change that
waits in the manager's outbox with the acks and releases (``ack_batch_interval``, ten to
a ``ChangeMessageVisibilityBatch`` call), and then nothing of it is left in the worker.
What to park, and for how long, is :mod:`celery_sqs_heartbeat.parking`'s decision.

A FIFO queue's parked message holds its message group, as a held one does: SQS gives out
no later message of the group while one is in flight, visible or not.
"""

from __future__ import annotations

import time
from typing import Any

from celery.utils.log import get_logger

from .leases import Lease, LeasePolicy
from .manager import VisibilityExtensionManager
from .options import HeartbeatOptions
from .parking import ParkingPolicy, read_due
from .receive_loop import ReceivingChannel
from .sqs import SQSQueue

__all__ = ["ParkingChannel"]

logger = get_logger(__name__)


class ParkingChannel(ReceivingChannel):
    """kombu's SQS channel that hides far-ETA tasks again at the receive."""

    options: HeartbeatOptions
    manager: VisibilityExtensionManager
    lease_policy: LeasePolicy

    def _unparked(self, received: list[dict[str, Any]], queue: SQSQueue) -> list[dict[str, Any]]:
        """The received messages to deliver; the others are parked until near their ETA."""
        if not self.options.eta_parking:
            return received
        policy = ParkingPolicy(self.options.eta_parking_threshold, self.lease_policy.hold_limit)
        now, received_at = time.time(), self.manager.clock()
        delivered: list[dict[str, Any]] = []
        parked: list[tuple[Lease, int]] = []
        for sqs_message in received:
            handle = sqs_message.get("ReceiptHandle")
            due = read_due(sqs_message.get("Body") or "") if handle else None
            hide = policy.hide_for(due, now)
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
            )
            parked.append((lease, hide))
            logger.info(
                "Parking task %s in SQS for %d s: its ETA is %.0f s away",
                lease.describe(),
                hide,
                (due.eta or now) - now,
            )
        if parked:
            self.manager.release(parked, "parked", self.options.ack_batch_interval)
        return delivered
