"""The kombu transport: glue between kombu's SQS channel and the lease manager.

A lease from receive to confirmed delete, one step a function:

1. born in :meth:`ReceiveSteps.born <celery_sqs_heartbeat.receiving.steps.ReceiveSteps.born>`
   as the ReceiveMessage answer arrives (event loop: :meth:`Channel._on_messages_ready`;
   blocking path: :meth:`Channel._receive_message`), which hands it to the manager
   (:meth:`VisibilityExtensionManager.track`); then a message held or acked here already
   is taken out, its body is read from S3, and
   :meth:`ReceiveSteps.sort <celery_sqs_heartbeat.receiving.steps.ReceiveSteps.sort>`
   parks a far-ETA task and holds the rest in the channel's
   :class:`~celery_sqs_heartbeat.leasing.lease_table.LeaseTable`
   (:mod:`celery_sqs_heartbeat.receiving.steps` has the order and why);
2. claimed in :meth:`Channel.claim_lease` (from :meth:`QoS.append`) when kombu hands the
   message to the consumer; what no consumer claimed goes back to SQS at once
   (:meth:`Channel._release_unclaimed`);
3. renewed by the manager's thread (:meth:`VisibilityExtensionManager._start_renewals`,
   one call a thread: ``_renew``) until it ends, on the client of the live channel
   (:mod:`celery_sqs_heartbeat.leasing.lease_queues`);
4. let go at the ack, in :meth:`SettlingChannel.basic_ack
   <celery_sqs_heartbeat.settling.channel.SettlingChannel.basic_ack>`, which leaves the delete in
   the manager's outbox (:meth:`VisibilityExtensionManager.delete`); a reject releases it
   instead (``SettlingChannel.basic_reject``, :meth:`VisibilityExtensionManager.release`),
   and so does the channel's close for messages Celery will not run (:meth:`QoS.restore_unacked`);
5. ended when SQS confirms the delete: the manager's ``_start_sends`` takes it out of the
   outbox and the book, ``_send`` makes the call on a thread of its own, and
   ``_settle_send`` ends the lease, or puts it back in the book if the delete failed.

The receive loop itself, its backoff and its waking on freed prefetch room, is
:class:`~celery_sqs_heartbeat.receiving.loop.ReceivingChannel`;
:class:`~celery_sqs_heartbeat.payloads.channel.PayloadChannel`, built on it, sends
bodies too large for SQS through S3 and reads them back, and
:class:`~celery_sqs_heartbeat.settling.channel.SettlingChannel` settles acks and rejects through
the manager. This channel extends both.
"""

from __future__ import annotations

import re
from functools import cache, partial
from queue import Empty
from typing import Any

import kombu
from celery import signals
from celery.utils.log import get_logger
from kombu.asynchronous import set_event_loop
from kombu.transport import SQS, virtual
from kombu.utils.objects import cached_property

from .aws.sqs_queue import SQSQueue
from .compat import KOMBU_BROADCASTS_THROUGH_SNS
from .leasing.lease_table import LeaseTable
from .leasing.leases import LeasePolicy
from .leasing.manager import VisibilityExtensionManager
from .monitoring import control  # noqa: F401  (importing registers the sqs_leases inspect commands)
from .monitoring.event_fanout import EventFanoutChannel, events_through_sns
from .monitoring.prometheus import start_exporter
from .monitoring.reply_queue_channel import KeepsReplyQueues
from .monitoring.timely_replies import RepliesWithinTheirTimeout
from .options import HeartbeatOptions
from .payloads.channel import PayloadChannel, ReadingQoS
from .payloads.options import LargePayloadOptions, PayloadAccess
from .payloads.store import PayloadStore
from .process import this_process
from .publishing.channel import BatchPublishingChannel
from .queues.cleanup import DeletesAutoDeleteQueues
from .queues.retention_channel import RetainsMessagesForTheirTtl
from .queues.urls import ForgetsDeletedQueueUrls
from .receiving.parker import Parker
from .receiving.receipt_redaction import redact_celery_reports
from .receiving.steps import Received, ReceiveSteps
from .settling import celery_requests
from .settling.channel import SettlingChannel
from .startup import (
    remote_control_notice,
    settings_line,
)
from .startup.checks import StartupChecks

__all__ = ["Channel", "QoS", "Transport"]

logger = get_logger(__name__)

#: kombu's Mailbox names a remote-control reply queue ``<routing key>.<reply exchange>``.
_PIDBOX_REPLY_EXCHANGE = re.compile(r"reply\..+\.pidbox")


class QoS(ReadingQoS):
    """kombu's SQS QoS, with a lease for every message it holds unacked."""

    channel: Channel

    def append(self, message: Any, delivery_tag: str) -> None:
        super().append(message, delivery_tag)
        self.channel.claim_lease(message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        super().ack(delivery_tag)
        self._settled(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        super().reject(delivery_tag, requeue)
        self._settled(delivery_tag)

    def forget(self, delivery_tag: str) -> None:
        """The channel released the message itself: kombu only forgets the delivery.

        kombu's reject would delete the message, re-publish it (requeue) or set its
        backoff visibility by its first receipt handle; none of that is wanted then.
        """
        virtual.QoS.reject(self, delivery_tag, requeue=False)
        self._settled(delivery_tag)

    def restore_unacked(self) -> list[Any]:
        """At channel close: release what Celery will not run instead of restoring copies.

        kombu's restore would hide each message again for ``wait_time_seconds``, one call
        per message. A message whose task ended and which Celery asked to ack is acked
        here: the ack queued on the event loop may never run. Messages Celery will still
        run or reject (started, handed to a pool that runs what it was handed, or with a
        reject queued: :mod:`~celery_sqs_heartbeat.settling.celery_requests`) stay held and
        renewed until their ack or reject; the rest go back to the queue at once.
        """
        delivered = [
            (tag, lease)
            for tag, lease in self.channel.lease_table.delivered()
            if tag in self._delivered
        ]
        for tag, _ in delivered:
            if celery_requests.asked_to_ack(tag):
                self.channel.basic_ack(tag)
        leaving = [
            tag
            for tag, lease in delivered
            if tag in self._delivered and not celery_requests.will_run(tag, lease.task_id)
        ]
        for tag in leaving:
            self._delivered.pop(tag, None)
            celery_requests.forget(tag)
        self.channel.end_leases(leaving, "shutdown")
        return []

    def _settled(self, delivery_tag: str) -> None:
        """kombu forgot the delivery: its room in the prefetch and its Celery request go."""
        celery_requests.forget(delivery_tag)
        self.channel.prefetch_room_freed()


class Channel(
    StartupChecks,
    BatchPublishingChannel,
    EventFanoutChannel,
    DeletesAutoDeleteQueues,
    KeepsReplyQueues,
    RepliesWithinTheirTimeout,
    ForgetsDeletedQueueUrls,
    RetainsMessagesForTheirTtl,
    SettlingChannel,
    PayloadChannel,
):
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
        self.lease_policy = LeasePolicy(
            visibility_timeout=self.options.visibility_timeout,
            threshold=self.options.visibility_extension_threshold,
            max_hold=self.options.visibility_extension_max,
        )
        parker = Parker(self.options, self.manager, self.lease_policy)
        self.steps = ReceiveSteps(
            self.options, self.manager, self.lease_table, self.lease_policy, parker
        )
        #: Messages the blocking receive being handled parked: it brought messages all the same.
        self._parked_by_receive = 0

    @cached_property
    def visibility_timeout(self) -> int:
        return self.options.visibility_timeout

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
        """The event loop's receive: the steps of :mod:`~celery_sqs_heartbeat.receiving.steps`.

        Leases are born for the whole batch first: kombu hands the batch to the consumer
        one message at a time, and in the solo pool each task runs before the next
        message is handed over. Then, if the answer was read late or bodies went through
        S3, the batch goes off the loop for the calls that takes, then it is sorted and
        delivered.
        """
        received = messages.get("Messages") or []
        if not received or qname not in self.connection._callbacks:
            # kombu releases what no consumer is left to take.
            return super()._on_messages_ready(queue, qname, messages)
        lease_queue = self._lease_queue(queue, qname)
        sent_at = self.answer_sent_at if self.answer_sent_at is not None else self.manager.clock()
        batch = self.steps.born(
            received, lease_queue, sent_at, held=qname not in self._noack_queues
        )
        first_steps = partial(self._confirm_and_recognise, lease_queue, sent_at)
        deliver = partial(self._sort_and_deliver, queue, qname, lease_queue)
        if self._off_the_loop(batch, qname, first_steps, deliver):
            return len(received)
        return deliver(first_steps(batch))

    def _confirm_and_recognise(
        self, lease_queue: SQSQueue, receive_sent_at: float, batch: list[Received]
    ) -> list[Received]:
        """Steps 1 (its confirmation) and 2: the leases of an answer read late are renewed
        first; then the messages held or acked here already are taken out.

        Blocking: on the blocking receive path, or on a thread off the event loop.
        """
        return self.steps.known(self.steps.confirm(batch, lease_queue, receive_sent_at))

    def _sort_and_deliver(
        self, queue: str, qname: str, lease_queue: SQSQueue, batch: list[Received]
    ) -> int:
        """Steps 4 and 5, then kombu's delivery; what no consumer claimed goes back to SQS.

        Returns what kombu counts as brought: parked messages count, or kombu would
        poll again only ``polling_interval`` later, and a burst of countdown tasks would
        be parked ten a second.
        """
        staying, parked = self.steps.sort(batch, lease_queue)
        try:
            if staying and not self.closed and qname in self.connection._callbacks:
                super()._on_messages_ready(queue, qname, {"Messages": [r.message for r in staying]})
        finally:
            self._release_unclaimed()
        return len(staying) + parked

    def _get_bulk(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """The blocking receive (gevent, eventlet): one that only parked receives again.

        kombu raises Empty when a receive delivers nothing, and its transport then waits
        ``polling_interval``: ten a second for a burst of countdown tasks. What was
        leased and nobody took goes back at once.
        """
        try:
            while True:
                self._parked_by_receive = 0
                try:
                    return super()._get_bulk(queue, *args, **kwargs)
                except Empty:
                    if not self._parked_by_receive:
                        raise
        finally:
            self._release_unclaimed()

    def _receive_message(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """The blocking receive: every step on what it brings, before kombu decodes it.

        kombu's ``basic_get`` receives here too; its message gets a lease only if the
        consumer keeps it unacked (:meth:`claim_lease`), but its body is read all the same.
        """
        sent_at = self.manager.clock()
        response = super()._receive_message(queue, *args, **kwargs)
        received = response.get("Messages") or []
        if received:
            held = self._receiving_in_bulk and queue not in self._noack_queues
            lease_queue = self._lease_queue(self._new_queue(queue), queue)
            batch = self.steps.born(received, lease_queue, sent_at, held)
            batch = self._read_bodies_now(
                self._confirm_and_recognise(lease_queue, sent_at, batch), queue
            )
            staying, parked = self.steps.sort(batch, lease_queue)
            self._parked_by_receive += parked
            response["Messages"] = [r.message for r in staying]
        return response

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
            lease_queue = self._lease_queue(info["sqs_queue"], queue_name)
            batch = self.steps.born([sqs_message], lease_queue, self.manager.clock())
            staying, _ = self.steps.sort(self.steps.known(batch), lease_queue)
            if staying:
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
        """The renewal target of a queue, from now on through this channel's client."""
        return this_process().lease_queues.of(
            self.canonical_queue_name(queue_name), queue_url, self
        )


class Transport(SQS.Transport):
    """kombu's SQS transport, keeping received messages invisible until they are acked."""

    Channel = Channel

    def __init__(self, client: Any, **kwargs: Any) -> None:
        # Checked before anything connects: a bad option stops the worker at start-up.
        self.heartbeat_options = HeartbeatOptions.from_transport_options(
            client.transport_options or {}
        )
        payload_options = LargePayloadOptions.from_transport_options(client.transport_options or {})
        payload_access = PayloadAccess.from_transport_options(client.transport_options or {})
        events_through_sns(client.transport_options or {})
        redact_celery_reports()
        self.payload_store = PayloadStore(payload_options, payload_access)
        super().__init__(client, **kwargs)
        if (client.transport_options or {}).get("supports_fanout") and KOMBU_BROADCASTS_THROUGH_SNS:
            # Broadcasts go through SNS then; saying so is what makes Celery start remote
            # control, which kombu's SQS transport never declares.
            self.implements = self.implements.extend(exchange_type=frozenset({"direct", "fanout"}))

    @cached_property
    def manager(self) -> VisibilityExtensionManager:
        """The process's one manager, shared by every connection; a test may set its own."""
        return this_process().manager

    def clock(self) -> float:
        """The clock of this connection's receives and leases: the manager's."""
        now: float = self.manager.clock()
        return now

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


def _say_at_worker_ready(sender: Any, **_: Any) -> None:
    """Celery's worker is up, its logging set: what this transport holds, then what cannot
    reach the worker (inspect, control, events), one INFO line each."""
    transport = getattr(getattr(sender, "connection", None), "transport", None)
    if not isinstance(transport, Transport):
        return
    store = transport.payload_store
    logger.info(
        "%s", settings_line.describe(transport.heartbeat_options, store.options, store.access)
    )
    if not sender.app.conf.worker_enable_remote_control:
        return
    options = sender.connection.transport_options or {}
    unreachable = remote_control_notice.notice(
        supports_fanout=options.get("supports_fanout") is True,
        events_through_sns=options.get("events_through_sns") is True,
        kombu_broadcasts_through_sns=KOMBU_BROADCASTS_THROUGH_SNS,
        kombu_version=kombu.__version__,
    )
    if unreachable is not None:
        logger.info(unreachable)


signals.worker_ready.connect(_say_at_worker_ready, weak=False)


@cache
def _warn_broadcast_needs_sns() -> None:
    logger.warning(
        "supports_fanout is set, but this kombu (%s) has no SNS fanout for SQS, which came "
        "in kombu 5.7: broadcasts would reach no worker, so remote control (celery "
        "inspect, celery control) stays off",
        kombu.__version__,
    )
