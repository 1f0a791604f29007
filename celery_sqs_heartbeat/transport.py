"""The kombu transport: glue between kombu's SQS channel and the lease manager.

A lease from receive to confirmed delete, one step a function:

1. born in :meth:`Channel._leases_from_receive` as the ReceiveMessage answer arrives
   (asynchronous path: ``_on_messages_ready``; blocking path: ``_receive_message``);
   :meth:`Channel._admit` hands it to the manager (:meth:`VisibilityExtensionManager.track`)
   and holds it in the channel's :class:`~celery_sqs_heartbeat.lease_table.LeaseTable`;
2. claimed in :meth:`Channel.claim_lease` (from :meth:`QoS.append`) when kombu hands the
   message to the consumer; what no consumer claimed goes back to SQS at once
   (:meth:`Channel._release_unclaimed`);
3. renewed by the manager's thread (:meth:`VisibilityExtensionManager._start_renewals`,
   one call a thread: ``_renew``) until it ends;
4. let go at the ack, in :meth:`Channel.basic_ack`, which leaves the delete in the
   manager's outbox (:meth:`VisibilityExtensionManager.delete`); a reject releases it
   instead (:meth:`Channel.basic_reject`, :meth:`VisibilityExtensionManager.release`),
   and so does the channel's close for messages that never started (:meth:`QoS.restore_unacked`);
5. ended when SQS confirms the delete: the manager's ``_start_sends`` takes it out of the
   outbox and the book, ``_send`` makes the call on a thread of its own, and
   ``_settle_send`` ends the lease, or puts it back in the book if the delete failed.

The receive loop itself, its backoff and its waking on freed prefetch room, is
:class:`~celery_sqs_heartbeat.receive_loop.ReceivingChannel`; before step 1,
:class:`~celery_sqs_heartbeat.parking_channel.ParkingChannel` hides tasks whose ETA is
far away again, and they never become leases; after it,
:class:`~celery_sqs_heartbeat.payload_channel.PayloadChannel` reads bodies too large
for SQS from S3. This channel extends both.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from functools import cache
from typing import Any, cast

import kombu
from botocore.client import BaseClient
from celery.utils.log import get_logger
from kombu.asynchronous import set_event_loop
from kombu.transport import SQS
from kombu.transport.virtual import Channel as VirtualChannel
from kombu.utils.objects import cached_property

from . import control  # noqa: F401  (importing registers the sqs_leases inspect commands)
from .compat import KOMBU_BROADCASTS_THROUGH_SNS, is_backoff_task
from .lease_table import LeaseTable
from .leases import Lease, LeasePolicy
from .manager import VisibilityExtensionManager, shared_manager
from .options import HeartbeatOptions
from .parking_channel import ParkingChannel
from .payload_channel import PayloadChannel, ReadingQoS
from .payload_options import LargePayloadOptions
from .payload_store import PayloadStore
from .prometheus import start_exporter
from .queue_urls import ForgetsDeletedQueueUrls
from .redelivery import receive_count
from .sqs import SQSQueue
from .sqs_facts import is_fifo

__all__ = ["Channel", "QoS", "Transport"]

logger = get_logger(__name__)

#: kombu's Mailbox names a remote-control reply queue ``<routing key>.<reply exchange>``.
_PIDBOX_REPLY_EXCHANGE = re.compile(r"reply\..+\.pidbox")

#: How long closing a channel waits for pending deletes and releases to be confirmed.
SHUTDOWN_FLUSH_TIMEOUT = 10.0


class QoS(ReadingQoS):
    """kombu's SQS QoS, with a lease for every message it holds unacked."""

    channel: Channel

    def append(self, message: Any, delivery_tag: str) -> None:
        super().append(message, delivery_tag)
        self.channel.claim_lease(message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        super().ack(delivery_tag)
        self.channel.prefetch_room_freed()

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        super().reject(delivery_tag, requeue)
        self.channel.prefetch_room_freed()

    def restore_unacked(self) -> list[Any]:
        """At channel close: release what never started instead of restoring copies.

        kombu's restore would hide each message again for ``wait_time_seconds``, one call
        per message. Messages whose task is still running stay held (and renewed) so the
        task can finish and ack; the rest go back to the queue at once.
        """
        self._flush()
        running = _running_task_ids()
        leaving = [
            tag
            for tag, lease in self.channel.lease_table.delivered()
            if tag in self._delivered and lease.task_id not in running
        ]
        for tag in leaving:
            self._delivered.pop(tag, None)
        self.channel.end_leases(leaving, "shutdown")
        return []


class Channel(ForgetsDeletedQueueUrls, ParkingChannel, PayloadChannel):
    """kombu's SQS channel, holding a lease on every message it received and not acked."""

    QoS = QoS
    connection: Transport

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Kept, not read through the connection: after a reconnect the old channel is
        #: closed and has no connection, but its running tasks still ack through it.
        self.options: HeartbeatOptions = self.connection.heartbeat_options
        self.manager: VisibilityExtensionManager = self.connection.manager
        self.lease_table = LeaseTable()

    @cached_property
    def visibility_timeout(self) -> int:
        return self.options.visibility_timeout

    @cached_property
    def lease_policy(self) -> LeasePolicy:
        return LeasePolicy(
            visibility_timeout=self.options.visibility_timeout,
            threshold=self.options.visibility_extension_threshold,
            max_hold=self.options.visibility_extension_max,
        )

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        # Consumers only: producers never open a port, and in a prefork worker the main
        # process, which consumes, is the one that holds and renews the leases.
        start_exporter(self.options)
        if self.transport_options.get("supports_fanout") and not KOMBU_BROADCASTS_THROUGH_SNS:
            _warn_broadcast_needs_sns()
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def _lookup(self, exchange: str, routing_key: str, default: Any = None) -> list[str]:
        """Route remote-control replies to the asking client's own reply queue.

        SQS keeps bindings only in the memory of the process that declared them, so a
        worker never knows the reply queue of ``celery inspect``, and kombu dropped
        every reply without a word.
        """
        queues: list[str] = super()._lookup(exchange, routing_key, default)
        if not queues and routing_key and _PIDBOX_REPLY_EXCHANGE.fullmatch(exchange or ""):
            return [f"{routing_key}.{exchange}"]
        return queues

    def _on_messages_ready(self, queue: str, qname: str, messages: Any) -> Any:
        """The worker's receive path: leases for the whole batch, then kombu's delivery.

        kombu hands the batch to the consumer one message at a time, and in the solo pool
        each task runs before the next message is handed over. So every message's lease
        starts here, when SQS's lease starts, not when the consumer gets to it.
        """
        received = messages.get("Messages") or []
        if received and qname in self.connection._callbacks and qname not in self._noack_queues:
            messages["Messages"] = self._leases_from_receive(received, queue, qname)
        try:
            return super()._on_messages_ready(queue, qname, messages)
        finally:
            self._release_unclaimed()

    def _get_bulk(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """The blocking receive path: what it leased and nobody took goes back at once."""
        try:
            return super()._get_bulk(queue, *args, **kwargs)
        finally:
            self._release_unclaimed()

    def _receive_message(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """The blocking receive: leases for what it brings, when ``_get_bulk`` asked.

        kombu's ``basic_get`` receives here too; its message gets a lease only if the
        consumer keeps it unacked (:meth:`claim_lease`).
        """
        response = super()._receive_message(queue, *args, **kwargs)
        received = response.get("Messages") or []
        if received and self._receiving_in_bulk and queue not in self._noack_queues:
            queue_url = self._new_queue(queue)
            response["Messages"] = self._leases_from_receive(received, queue_url, queue)
        return response

    def _leases_from_receive(
        self, received: list[dict[str, Any]], queue_url: str, queue_name: str
    ) -> list[dict[str, Any]]:
        """Leases are born: SQS has just started hiding these messages from others.

        Returns the messages to hand to the consumer. A message this channel holds
        already is not handed over twice: its lease lapsed (an outage longer than a
        lease) and SQS gave it out again, maybe to this very worker. Then the task in
        progress keeps running here, on the new lease. Opting out of renewals opts out
        of this too: kombu's own behaviour, redeliveries and all. A message acked here
        whose delete has not landed, or landed by an older receipt and so deleted nothing
        (within the last minute), is not run again either: it is deleted by the new one.
        """
        now = self.manager.clock()
        to_deliver: list[dict[str, Any]] = []
        for sqs_message in self._unparked(received, self._lease_queue(queue_url, queue_name)):
            handle = sqs_message.get("ReceiptHandle")
            if not handle:
                to_deliver.append(sqs_message)
                continue
            lease = Lease(
                receipt_handle=handle,
                queue=self._lease_queue(queue_url, queue_name),
                policy=self.lease_policy,
                received_at=now,
                message_id=sqs_message.get("MessageId"),
                receive_count=receive_count(sqs_message.get("Attributes") or {}),
            )
            if self._admit(lease):
                to_deliver.append(sqs_message)
        return to_deliver

    def _admit(self, lease: Lease) -> bool:
        """Hold and renew a new lease; whether its message is to be delivered."""
        if self.options.visibility_extension:
            self.manager.track(lease, self.options.visibility_extension_interval)
            replaced = self.lease_table.adopt(lease)
            if replaced is not None:
                self.manager.end(replaced)
                logger.warning(
                    "SQS delivered message %s again while this worker still holds it (%s); "
                    "it is not run twice here, and its lease continues on the new receipt",
                    lease.message_id,
                    replaced.describe(),
                )
                return False
        if self.manager.redirect_delete(lease):
            logger.warning(
                "SQS delivered message %s again after this worker acked it (%s); it is "
                "deleted by the new receipt, not run again",
                lease.message_id,
                lease.describe(),
            )
            return False
        self.lease_table.admit(lease)
        return True

    def claim_lease(self, message: Any, delivery_tag: str) -> None:
        """The consumer took ``message``: its lease now lasts until the ack or reject."""
        headers = message.headers or {}
        task = (headers.get("id"), headers.get("task"))
        if self.lease_table.claim(delivery_tag, *task) is not None:
            return
        # Received some other way (kombu's basic_get): the lease starts now.
        info = message.delivery_info
        if info.get("sqs_queue"):
            sqs_message = info.get("sqs_message") or {"ReceiptHandle": delivery_tag}
            queue_name = self.canonical_queue_name(info.get("routing_key") or "")
            if self._leases_from_receive([sqs_message], info["sqs_queue"], queue_name):
                self.lease_table.claim(delivery_tag, *task)

    def _release_unclaimed(self) -> None:
        """Messages received but never handed to the consumer go straight back to SQS.

        A body kombu cannot decode raises before delivery; without this its lease would be
        renewed for as long as the worker lives.
        """
        stranded = self.lease_table.take_unclaimed()
        if stranded:
            logger.warning(
                "Releasing %d received message(s) that were never delivered to the consumer",
                len(stranded),
            )
            self.manager.release([(lease, 0) for lease in stranded], "not delivered")

    def _lease_queue(self, queue_url: str, queue_name: str) -> SQSQueue:
        """The renewal target of a queue, shared by the connection's channels."""
        known = self.connection.lease_queues.get(queue_url)
        if known is not None:
            return known
        name = self.canonical_queue_name(queue_name)
        client = self.sqs(queue=name)

        def current_client() -> BaseClient:
            # kombu may swap the client (STS token refresh); after the channel closed,
            # the last one is still good for the renewals of tasks that keep running.
            nonlocal client
            if self.connection is not None and not self.closed:
                client = self.sqs(queue=name)
            return client

        queue = self.connection.lease_queues[queue_url] = SQSQueue(name, queue_url, current_client)
        return queue

    def end_leases(self, delivery_tags: Iterable[str], reason: str) -> None:
        """Release unstarted messages at shutdown, or just stop renewing them."""
        leases = [lease for tag in delivery_tags if (lease := self.lease_table.let_go(tag))]
        if not leases:
            return
        if self.options.release_on_shutdown:
            self.manager.release(
                [
                    (lease, self._shutdown_release_delay(cast(SQSQueue, lease.queue).url))
                    for lease in leases
                ],
                reason,
            )
            self._flush()
        else:
            for lease in leases:
                self.manager.end(lease)

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        """Leave the delete to the manager's outbox; the lease holds until SQS confirms it.

        Returns at once, never raises: a delete that fails is retried while the lease is
        renewed, so Celery never logs "Couldn't ack" with a receipt handle, and a finished
        task is never handed to another worker because its delete failed for a while.
        """
        lease = self.lease_table.let_go(delivery_tag)
        if lease is None or not self.options.ack_batching:
            if lease is not None:
                # kombu's own ack: the lease ends before its synchronous delete.
                self.manager.end(lease)
                self._point_kombu_at(delivery_tag, lease)
            super().basic_ack(delivery_tag, multiple)
            return
        self.manager.delete(lease, self._batch_wait(lease))
        VirtualChannel.basic_ack(self, delivery_tag, multiple)

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """Release the message to SQS instead of deleting or re-publishing it.

        SQS then counts the receive and moves the message to the dead-letter queue after
        ``maxReceiveCount``: retries are bookkept where they survive the worker.
        """
        lease = self.lease_table.get(delivery_tag)
        releasing = lease is not None and (
            requeue
            or (self.options.release_on_failure and not is_backoff_task(self.qos, delivery_tag))
        )
        if lease is None or not releasing:
            # kombu deletes the message here unless the queue has a dead-letter queue,
            # through _delete_rejected_message, which hands the delete to the outbox.
            super().basic_reject(delivery_tag, requeue)
            lease = self.lease_table.let_go(delivery_tag)
            if lease is not None:
                self.manager.end(lease)
            return
        self.lease_table.let_go(delivery_tag)
        delay = self.options.release_delay_for(lease.receive_count)
        self.manager.release(
            [(lease, delay)], "requeue" if requeue else "failure", self._batch_wait(lease)
        )
        # kombu's own reject would delete the message, or re-publish it on requeue; here
        # it only has to forget the delivery.
        VirtualChannel.basic_reject(self, delivery_tag, requeue=False)

    def _delete_rejected_message(self, delivery_tag: str) -> None:
        """kombu deletes a message rejected without requeue: through the outbox here."""
        lease = self.lease_table.get(delivery_tag)
        if lease is None or not self.options.ack_batching:
            if lease is not None:
                self._point_kombu_at(delivery_tag, lease)
            super()._delete_rejected_message(delivery_tag)
            return
        queue = cast(SQSQueue, lease.queue)
        if self._has_redrive_policy(queue.name, queue.url):
            return  # SQS moves it to the dead-letter queue after maxReceiveCount
        self.lease_table.let_go(delivery_tag)
        self.manager.delete(lease, self._batch_wait(lease))

    def _batch_wait(self, lease: Lease) -> float:
        """How long a delete or release may wait for company in its batch call.

        A FIFO queue holds back the rest of a message group until the message is
        deleted, so its deletes go out at once (with whatever of the queue is waiting).
        """
        if is_fifo(cast(SQSQueue, lease.queue).name):
            return 0.0
        return self.options.ack_batch_interval

    def _flush(self) -> None:
        left = self.manager.flush(SHUTDOWN_FLUSH_TIMEOUT)
        if left:
            logger.warning(
                "%d SQS delete(s) or release(s) were not confirmed within %.0f s of closing "
                "the channel; they are still retried while the worker runs, and those "
                "messages become visible again when their leases end",
                left,
                SHUTDOWN_FLUSH_TIMEOUT,
            )

    def close(self) -> None:
        """Send pending deletes before the channel goes: the worker may be about to exit."""
        super().close()
        self._flush()

    def _point_kombu_at(self, delivery_tag: str, lease: Lease) -> None:
        """Make kombu's delete use the newest receipt: SQS ignores a delete by an older one."""
        try:
            sqs_message = self.qos.get(delivery_tag).delivery_info["sqs_message"]
        except KeyError:
            return
        sqs_message["ReceiptHandle"] = lease.receipt_handle


class Transport(SQS.Transport):
    """kombu's SQS transport, keeping received messages invisible until they are acked."""

    Channel = Channel

    def __init__(self, client: Any, **kwargs: Any) -> None:
        # Checked before anything connects: a bad option stops the worker at start-up.
        self.heartbeat_options = HeartbeatOptions.from_transport_options(
            client.transport_options or {}
        )
        payload_options = LargePayloadOptions.from_transport_options(client.transport_options or {})
        self.payload_store = PayloadStore(payload_options)
        super().__init__(client, **kwargs)
        self.lease_queues: dict[str, SQSQueue] = {}
        if (client.transport_options or {}).get("supports_fanout") and KOMBU_BROADCASTS_THROUGH_SNS:
            # Broadcasts go through SNS then; saying so is what makes Celery start remote
            # control, which kombu's SQS transport never declares.
            self.implements = self.implements.extend(exchange_type=frozenset({"direct", "fanout"}))

    @cached_property
    def manager(self) -> VisibilityExtensionManager:
        """The process's one manager, shared by every connection; a test may set its own."""
        return shared_manager()

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """Celery hands its event loop over on every (re)connect: poll and talk on it.

        kombu's SQS channels and their HTTP client take the process's current event loop
        when they are made, and Celery's consumer clears it when its loop stops. So after
        a reconnect, kombu's channels found no loop and never received again, however
        healthy SQS was.
        """
        set_event_loop(loop)
        for channel in self.channels:
            channel.hub = loop


@cache
def _warn_broadcast_needs_sns() -> None:
    logger.warning(
        "supports_fanout is set, but this kombu (%s) has no SNS fanout for SQS, which came "
        "in kombu 5.7: broadcasts would reach no worker, so remote control (celery "
        "inspect, celery control) stays off",
        kombu.__version__,
    )


def _running_task_ids() -> set[str]:
    """Ids of the tasks this worker has started and not finished.

    Only a Celery worker knows which received messages a pool has started; outside one
    (a plain kombu consumer), nothing counts as started.
    """
    state = sys.modules.get("celery.worker.state")
    if state is None:
        return set()
    return {request.id for request in list(state.active_requests)}
