"""A receive's messages, step by step, in the one order that runs every task once.

1. **born**: every message gets a lease, counted from when its ReceiveMessage was *sent*:
   SQS started it at some point after, so that is the earliest it can run out. It is
   renewed from then on, so that everything below, an S3 read above all, happens under
   it (:meth:`ReceiveSteps.born`). An answer read so late that its leases were already
   due (a solo worker's event loop, blocked by a task while the answer waited) is
   delivered only once a renewal confirms that SQS still holds the message for this
   receipt: meanwhile SQS may have handed it to another worker (:meth:`ReceiveSteps.confirm`);
2. **known**: a message this channel holds already (its lease lapsed and SQS handed it out
   again) or acked a moment ago is not delivered again (:meth:`ReceiveSteps.known`); its
   message id is all this takes, so its body is not read: an acked message's S3 object
   may be gone with its delete;
3. **bodies**: a body that went through S3 is read back, before anything reads the task's
   headers (the channel does this: off the event loop, or inline on the blocking path);
4. **parked**: a task whose ETA is far away is hidden again in SQS and forgotten
   (:class:`~celery_sqs_heartbeat.receiving.parker.Parker`);
5. **admitted**: the rest wait in the channel's lease table for the consumer to claim them.

The channel runs step 1 (with its confirmation, a call to SQS), 2, 3 (S3 reads), then
:meth:`ReceiveSteps.sort` (4 and 5), then hands what is left to kombu; the calls (the
confirmation, the reads) go off the event loop together. Written here as one sequence
because the order is the point: a task parked before its body was read was never parked
(its ETA is in S3), one parked before the check for a held message was run twice, one
delivered from an answer read after its lease ran out ran twice, and an acked message
received again whose object went with the delete was released for ever instead of
deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from celery.utils.log import get_logger

from ..aws.sqs_queue import SQSQueue
from ..leasing.lease_table import LeaseTable
from ..leasing.leases import EntryResult, Lease, LeasePolicy
from ..leasing.manager import VisibilityExtensionManager
from ..options import HeartbeatOptions
from ..process import this_process
from .redelivery import receive_count

__all__ = ["ReceiveSteps", "Received"]

logger = get_logger(__name__)


@dataclass
class Received:
    """One message of a ReceiveMessage answer, on its way through the steps."""

    #: The message as SQS answered it; step 3 replaces an S3 pointer by its body.
    message: dict[str, Any]
    #: None for a message that is not held: a no-ack queue's, or one without a handle.
    lease: Lease | None
    #: Its lease was due when the answer was read: not renewed, nor delivered, until a
    #: renewal confirms it (:meth:`ReceiveSteps.confirm`).
    unconfirmed: bool = False
    #: The body as SQS holds it, an S3 pointer still: what a fresh copy sends (step 4).
    sent_body: str = field(init=False)

    def __post_init__(self) -> None:
        self.sent_body = self.message.get("Body") or ""


class ParkStep(Protocol):
    """Step 4: :class:`~celery_sqs_heartbeat.receiving.parker.Parker`."""

    def park(self, batch: list[Received], queue: SQSQueue) -> tuple[list[Received], int]: ...


class ReceiveSteps:
    """Steps 1, 3, 4 and 5 of one channel's receives."""

    def __init__(
        self,
        options: HeartbeatOptions,
        manager: VisibilityExtensionManager,
        lease_table: LeaseTable,
        lease_policy: LeasePolicy,
        parker: ParkStep,
    ) -> None:
        self.options = options
        self.manager = manager
        self.lease_table = lease_table
        self.lease_policy = lease_policy
        self.parker = parker

    def born(
        self, messages: list[dict[str, Any]], queue: SQSQueue, sent_at: float, held: bool = True
    ) -> list[Received]:
        """Step 1: a lease for every message, counted from ``sent_at``, renewed from now.

        ``held`` False (a no-ack queue, kombu's ``basic_get``): the messages go through
        the steps without leases. A lease already due for renewal is left unconfirmed.
        """
        now = self.manager.clock()
        batch = []
        for message in messages:
            handle = message.get("ReceiptHandle")
            if not (held and handle):
                batch.append(Received(message, None))
                continue
            lease = Lease(
                receipt_handle=handle,
                queue=queue,
                policy=self.lease_policy,
                received_at=sent_at,
                message_id=message.get("MessageId"),
                receive_count=receive_count(message.get("Attributes") or {}),
            )
            late = lease.expires_at - now <= self.lease_policy.margin_ceiling
            confirm = self.options.visibility_extension and late
            if self.options.visibility_extension and not confirm:
                self.manager.track(lease, self.options.visibility_extension_interval)
            batch.append(Received(message, lease, unconfirmed=confirm))
        return batch

    def confirm(
        self, batch: list[Received], queue: SQSQueue, receive_sent_at: float
    ) -> list[Received]:
        """Step 1's confirmation: the batch less the late leases SQS did not confirm.

        Blocking: the late leases are renewed now, and those SQS confirmed are tracked
        (:meth:`VisibilityExtensionManager.confirm`); one released meanwhile (the channel
        closed) stays released and is not run. ``receive_sent_at`` is when the receive
        that brought the batch was sent.
        """
        now = self.manager.clock()
        renewals = [
            (lease, lease.capped_visibility(self.lease_policy.visibility_timeout, now))
            for received in batch
            if received.unconfirmed and (lease := received.lease) is not None
        ]
        if not renewals:
            return batch
        interval = self.options.visibility_extension_interval
        answers = self.manager.confirm(queue, renewals, interval)
        return self._confirmed(batch, answers, now - receive_sent_at)

    def _confirmed(
        self,
        batch: list[Received],
        answers: Mapping[Lease, tuple[EntryResult, str]],
        read_after: float,
    ) -> list[Received]:
        """The batch less the late leases SQS did not confirm, or that ended meanwhile.

        A refused renewal means SQS handed the message to someone else meanwhile (or the
        handle is otherwise no longer good): it is not run here. One that failed for a
        passing reason cannot tell: the message is not run here either, and SQS shows
        it again when its lease ends. Either way nothing is lost, and nothing runs twice.
        ``read_after`` is how long after its receive was sent the answer was read.
        """
        kept: list[Received] = []
        dropped: list[tuple[Lease, str]] = []
        for received in batch:
            lease = received.lease
            if not received.unconfirmed or lease is None:
                kept.append(received)
                continue
            if lease.ended:  # released meanwhile: the channel closed
                continue
            outcome, reason = answers.get(lease, (EntryResult.TRANSIENT, "no answer"))
            if outcome is not EntryResult.OK:
                dropped.append((lease, reason))
                continue
            received.unconfirmed = False
            kept.append(received)
        if dropped:
            logger.warning(
                "Not running %d message(s) whose answer was read %.1f s after the receive "
                "was sent, so late that their %d s lease may have run out, and that SQS did "
                "not confirm as still this worker's (%s): SQS may have handed them to "
                "another worker, and shows them again otherwise",
                len(dropped),
                read_after,
                self.lease_policy.visibility_timeout,
                "; ".join(f"message {lease.message_id}: {reason}" for lease, reason in dropped),
            )
        return kept

    def known(self, batch: list[Received]) -> list[Received]:
        """Step 2: the batch less the messages held or just acked here."""
        return [received for received in batch if not self._known(received.lease)]

    def sort(self, batch: list[Received], queue: SQSQueue) -> tuple[list[Received], int]:
        """Steps 4 and 5: the messages to deliver, and how many were parked."""
        staying, parked = self.parker.park(batch, queue)
        for received in staying:
            if received.lease is not None:
                self.lease_table.admit(received.lease)
        return staying, parked

    def _known(self, lease: Lease | None) -> bool:
        """Whether ``lease`` is a new receive of a message held or acked here.

        A message held here already keeps running on the new lease; opting out of
        renewals opts out of this too (kombu's own behaviour, redeliveries and all). A
        message acked here whose delete has not landed, or landed by an older receipt
        and so deleted nothing (within the last minute), is deleted by the new one.
        """
        if lease is None:
            return False
        if self.options.visibility_extension:
            replaced = self.lease_table.adopt(lease)
            if replaced is not None:
                self.manager.end(replaced)
                this_process().s3_cleanup.moved(replaced, lease)
                logger.warning(
                    "SQS delivered message %s again while this worker still holds it (%s); "
                    "it is not run twice here, and its lease continues on the new receipt",
                    lease.message_id,
                    replaced.describe(),
                )
                return True
        acked = self.manager.redirect_delete(lease)
        if acked is not None:
            this_process().s3_cleanup.moved(acked, lease)
            logger.warning(
                "SQS delivered message %s again after this worker acked it (%s); it is "
                "deleted by the new receipt, not run again",
                lease.message_id,
                lease.describe(),
            )
            return True
        return False
