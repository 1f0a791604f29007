"""What a channel's receives bring, taken into leases and handed to kombu's delivery.

On both receive paths, the steps of :mod:`celery_sqs_heartbeat.receiving.steps` run on
each answer in their order (why that order: there): leases born for the whole batch,
a late answer's leases confirmed, messages held or acked here already taken out, bodies
read from S3 (:class:`~celery_sqs_heartbeat.payloads.reader.PayloadReader`, off the
event loop when a call is needed), far-ETA tasks parked; then kombu delivers the rest.
What no consumer claimed goes back to SQS at once. The channel calls in here from its
kombu hooks (``_on_messages_ready``, ``_receive_message``, ``_get_bulk``) and from its
QoS (``append``), handing over kombu's own step where this part goes around it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from queue import Empty
from typing import TYPE_CHECKING, Any, Protocol

from botocore.client import BaseClient
from celery.utils.log import get_logger

from ..aws.sqs_queue import SQSQueue
from ..process import this_process
from .steps import Received, ReceiveSteps

if TYPE_CHECKING:
    from ..leasing.lease_table import LeaseTable
    from ..leasing.manager import VisibilityExtensionManager
    from ..payloads.reader import PayloadReader
    from .receiver import Receiver

__all__ = ["Intake", "IntakePort"]

logger = get_logger(__name__)

#: kombu's delivery of an answer: ``_on_messages_ready(queue, qname, messages)``.
KombuDelivery = Callable[[str, str, Any], Any]


class IntakePort(Protocol):
    """What the intake reads of its kombu channel; also what a lease's renewals ask it."""

    @property
    def closed(self) -> bool: ...

    @property
    def connection(self) -> Any: ...

    @property
    def _noack_queues(self) -> set[str]: ...

    def canonical_queue_name(self, queue_name: str) -> str: ...

    def sqs(self, queue: str | None = None) -> BaseClient: ...

    def _new_queue(self, queue: str) -> str: ...


class Intake:
    """One channel's leases from the receive to the consumer's claim."""

    def __init__(
        self,
        channel: IntakePort,
        manager: VisibilityExtensionManager,
        lease_table: LeaseTable,
        steps: ReceiveSteps,
        receiver: Receiver,
        payload_reader: PayloadReader,
    ) -> None:
        self._channel = channel
        self._manager = manager
        self._lease_table = lease_table
        self._steps = steps
        self._receiver = receiver
        self._payload_reader = payload_reader
        #: Messages the blocking receive being handled parked: it brought messages all the same.
        self._parked_by_receive = 0

    def messages_ready(
        self, queue: str, qname: str, messages: Any, kombu_deliver: KombuDelivery
    ) -> Any:
        """The event loop's receive: the steps of :mod:`~celery_sqs_heartbeat.receiving.steps`.

        Leases are born for the whole batch first: kombu hands the batch to the consumer
        one message at a time, and in the solo pool each task runs before the next
        message is handed over. Then, if the answer was read late or bodies went through
        S3, the batch goes off the loop for the calls that takes, then it is sorted and
        delivered.
        """
        received = messages.get("Messages") or []
        if not received or qname not in self._channel.connection._callbacks:
            # kombu releases what no consumer is left to take.
            return kombu_deliver(queue, qname, messages)
        lease_queue = self.lease_queue(queue, qname)
        answer_sent_at = self._receiver.answer_sent_at
        sent_at = answer_sent_at if answer_sent_at is not None else self._manager.clock()
        batch = self._steps.born(
            received, lease_queue, sent_at, held=qname not in self._channel._noack_queues
        )
        first_steps = partial(self._confirm_and_recognise, lease_queue, sent_at)
        deliver = partial(self._sort_and_deliver, queue, qname, lease_queue, kombu_deliver)
        if self._payload_reader.off_the_loop(batch, qname, first_steps, deliver):
            return len(received)
        return deliver(first_steps(batch))

    def _confirm_and_recognise(
        self, lease_queue: SQSQueue, receive_sent_at: float, batch: list[Received]
    ) -> list[Received]:
        """Steps 1 (its confirmation) and 2: the leases of an answer read late are renewed
        first; then the messages held or acked here already are taken out.

        Blocking: on the blocking receive path, or on a thread off the event loop.
        """
        return self._steps.known(self._steps.confirm(batch, lease_queue, receive_sent_at))

    def _sort_and_deliver(
        self,
        queue: str,
        qname: str,
        lease_queue: SQSQueue,
        kombu_deliver: KombuDelivery,
        batch: list[Received],
    ) -> int:
        """Steps 4 and 5, then kombu's delivery; what no consumer claimed goes back to SQS.

        Returns what kombu counts as brought: parked messages count, or kombu would
        poll again only ``polling_interval`` later, and a burst of countdown tasks would
        be parked ten a second.
        """
        staying, parked = self._steps.sort(batch, lease_queue)
        channel = self._channel
        try:
            if staying and not channel.closed and qname in channel.connection._callbacks:
                kombu_deliver(queue, qname, {"Messages": [r.message for r in staying]})
        finally:
            self.release_unclaimed()
        return len(staying) + parked

    def get_bulk(self, get_bulk: Callable[[], Any]) -> Any:
        """The blocking receive (gevent, eventlet): one that only parked receives again.

        kombu raises Empty when a receive delivers nothing, and its transport then waits
        ``polling_interval``: ten a second for a burst of countdown tasks. What was
        leased and nobody took goes back at once.
        """
        try:
            while True:
                self._parked_by_receive = 0
                try:
                    return get_bulk()
                except Empty:
                    if not self._parked_by_receive:
                        raise
        finally:
            self.release_unclaimed()

    def receive_message(self, queue: str, receive: Callable[[], Any]) -> Any:
        """The blocking receive: every step on what ``receive()`` brings, before kombu decodes it.

        kombu's ``basic_get`` receives here too; its message gets a lease only if the
        consumer keeps it unacked (:meth:`claim`), but its body is read all the same.
        """
        sent_at = self._manager.clock()
        response = receive()
        received = response.get("Messages") or []
        if received:
            channel = self._channel
            held = self._receiver.blocking.in_bulk and queue not in channel._noack_queues
            lease_queue = self.lease_queue(channel._new_queue(queue), queue)
            batch = self._steps.born(received, lease_queue, sent_at, held)
            batch = self._payload_reader.read_bodies_now(
                self._confirm_and_recognise(lease_queue, sent_at, batch), queue
            )
            staying, parked = self._steps.sort(batch, lease_queue)
            self._parked_by_receive += parked
            response["Messages"] = [r.message for r in staying]
        return response

    def delete_no_ack(self, queue_name: str, message: dict[str, Any]) -> None:
        """Delete a message of a queue consumed without acks (a mailbox) through the
        manager's outbox, as an acked task's: off the event loop, retried until SQS
        confirms it, the message kept hidden meanwhile (renewed while
        ``visibility_extension`` is on), so its command does not run twice.
        """
        channel = self._channel
        lease_queue = self.lease_queue(channel._new_queue(queue_name), queue_name)
        sent_at = self._receiver.answer_sent_at
        received_by = self._manager.clock() if sent_at is None else sent_at
        # Born as a received task's lease is (renewed while its delete is retried).
        for received in self._steps.born([message], lease_queue, received_by):
            if received.lease is not None:
                self._manager.delete(received.lease, 0)

    def claim(self, message: Any, delivery_tag: str) -> None:
        """The consumer took ``message``: its lease now lasts until the ack or reject."""
        headers = message.headers or {}
        task = (headers.get("id"), headers.get("task"))
        if self._lease_table.claim(delivery_tag, *task) is not None:
            return
        # Received some other way (kombu's basic_get): the lease starts now.
        info = message.delivery_info
        if info.get("sqs_queue"):
            sqs_message = info.get("sqs_message") or {"ReceiptHandle": delivery_tag}
            queue_name = self._channel.canonical_queue_name(info.get("routing_key") or "")
            lease_queue = self.lease_queue(info["sqs_queue"], queue_name)
            batch = self._steps.born([sqs_message], lease_queue, self._manager.clock())
            staying, _ = self._steps.sort(self._steps.known(batch), lease_queue)
            if staying:
                self._lease_table.claim(delivery_tag, *task)

    def release_unclaimed(self) -> None:
        """Messages received but never handed to the consumer go straight back to SQS.

        A body kombu cannot decode raises before delivery; without this its lease would be
        renewed for as long as the worker lives.
        """
        stranded = self._lease_table.take_unclaimed()
        if stranded:
            logger.warning(
                "Releasing %d received message(s) that were never delivered to the consumer",
                len(stranded),
            )
            self._manager.release([(lease, 0) for lease in stranded], "not delivered")

    def lease_queue(self, queue_url: str, queue_name: str) -> SQSQueue:
        """The renewal target of a queue, from now on through this channel's client."""
        name = self._channel.canonical_queue_name(queue_name)
        return this_process().lease_queues.of(name, queue_url, self._channel)
