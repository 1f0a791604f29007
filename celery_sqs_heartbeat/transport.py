"""The kombu transport: glue between kombu's SQS channel and the lease manager.

Where a lease lives, in kombu's terms:

- born in :meth:`Channel._leases_from_receive`, as the ReceiveMessage answer arrives,
  and claimed in :meth:`QoS.append` when kombu hands the message to the consumer;
- renewed by :mod:`celery_sqs_heartbeat.manager` until it ends;
- ended in :meth:`Channel.basic_ack` (before the delete) or :meth:`Channel.basic_reject`,
  or released when the channel closes with messages that never started.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import Any, cast

from botocore.client import BaseClient
from celery.utils.log import get_logger
from kombu.transport import SQS
from kombu.transport.virtual import Channel as VirtualChannel
from kombu.utils.objects import cached_property

from .leases import Lease, LeasePolicy
from .manager import VisibilityExtensionManager, shared_manager
from .options import HeartbeatOptions
from .sqs import SQSQueue

__all__ = ["Channel", "QoS", "Transport"]

logger = get_logger(__name__)

#: How long closing a channel waits for the release of unstarted messages to go out.
SHUTDOWN_RELEASE_TIMEOUT = 10.0


class QoS(SQS.QoS):
    """kombu's SQS QoS, with a lease for every message it holds unacked."""

    channel: Channel

    def append(self, message: Any, delivery_tag: str) -> None:
        super().append(message, delivery_tag)
        self.channel.claim_lease(message, delivery_tag)

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
            for tag, lease in self.channel.leases.items()
            if tag in self._delivered and lease.task_id not in running
        ]
        for tag in leaving:
            self._delivered.pop(tag, None)
        self.channel.end_leases(leaving, "shutdown")
        return []


class Channel(SQS.Channel):
    """kombu's SQS channel, asking for the transport's lease on every receive."""

    QoS = QoS
    connection: Transport

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Leases of the messages this channel delivered and that are not acked yet,
        #: by delivery tag (the receipt handle).
        self.leases: dict[str, Lease] = {}
        #: Leases of messages received from SQS but not yet handed to the consumer.
        self._undelivered: dict[str, Lease] = {}
        self._bulk_leases: list[Lease] | None = None
        #: When each queue's pending long poll was sent, by queue URL.
        self._polls_pending: dict[str, float] = {}

    @property
    def options(self) -> HeartbeatOptions:
        return self.connection.heartbeat_options

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

    @property
    def manager(self) -> VisibilityExtensionManager:
        return shared_manager()

    def sqs(self, queue: str | None = None) -> BaseClient:
        """kombu's client for ``queue``, made to ask for the lease on blocking receives."""
        client = super().sqs(queue=queue)
        client.meta.events.register(
            "provide-client-params.sqs.ReceiveMessage",
            self._ask_for_lease,
            unique_id="celery_sqs_heartbeat.visibility_timeout",
        )
        return client

    def _ask_for_lease(self, params: dict[str, Any], **_: Any) -> None:
        # Without it SQS applies the queue's attribute, which may be hours: the lease
        # must be the one the manager renews.
        params.setdefault("VisibilityTimeout", self.visibility_timeout)

    def _get_from_sqs(
        self,
        queue_name: str,
        queue_url: str,
        connection: Any,
        count: int = 1,
        callback: Any = None,
    ) -> Any:
        self._polls_pending[queue_url] = self.manager.clock()
        pending = connection.receive_message(
            queue_name,
            queue_url,
            number_messages=count,
            visibility_timeout=self.visibility_timeout,
            wait_time_seconds=self.wait_time_seconds,
            callback=callback,
        )
        pending.then(lambda *_: self._polls_pending.pop(queue_url, None))
        return pending

    def _shutdown_release_delay(self, queue_url: str) -> int:
        """Seconds until this channel's own pending long poll on the queue must be over.

        Released earlier, a message could be handed to that poll, whose answer nobody
        reads any more once the worker stops: it would stay hidden for a whole lease.
        """
        sent_at = self._polls_pending.get(queue_url)
        if sent_at is None:
            return 0
        return max(0, math.ceil(sent_at + int(self.wait_time_seconds) - self.manager.clock()))

    def _on_messages_ready(self, queue: str, qname: str, messages: Any) -> Any:
        """The worker's receive path: leases for the whole batch, then kombu's delivery.

        kombu hands the batch to the consumer one message at a time, and in the solo pool
        each task runs before the next message is handed over. So every message's lease
        starts here, when SQS's lease starts, not when the consumer gets to it.
        """
        received = (messages.get("Messages") or []) if isinstance(messages, dict) else []
        if qname not in self.connection._callbacks or qname in self._noack_queues:
            # kombu releases or deletes these itself.
            received = []
        leases = self._leases_from_receive(received, queue, qname)
        try:
            return super()._on_messages_ready(queue, qname, messages)
        finally:
            self._release_undelivered(leases)

    def _get_bulk(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """The blocking receive path (no event loop: gevent, eventlet, plain kombu)."""
        self._bulk_leases = []
        try:
            return super()._get_bulk(queue, *args, **kwargs)
        finally:
            leases, self._bulk_leases = self._bulk_leases or [], None
            self._release_undelivered(leases)

    def _receive_message(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        response = super()._receive_message(queue, *args, **kwargs)
        if self._bulk_leases is not None and queue not in self._noack_queues:
            received = response.get("Messages") or []
            queue_url = self._new_queue(queue)
            self._bulk_leases.extend(self._leases_from_receive(received, queue_url, queue))
        return response

    def _leases_from_receive(
        self, received: list[dict[str, Any]], queue_url: str, queue_name: str
    ) -> list[Lease]:
        """Leases are born: SQS has just started hiding these messages from others."""
        now = self.manager.clock()
        born = []
        for sqs_message in received:
            handle = sqs_message.get("ReceiptHandle")
            if not handle:
                continue
            attributes = sqs_message.get("Attributes") or {}
            lease = Lease(
                receipt_handle=handle,
                queue=self._lease_queue(queue_url, queue_name),
                policy=self.lease_policy,
                received_at=now,
                receive_count=int(attributes.get("ApproximateReceiveCount", 1)),
            )
            self._undelivered[handle] = lease
            if self.options.visibility_extension:
                self.manager.track(lease, self.options.visibility_extension_interval)
            born.append(lease)
        return born

    def claim_lease(self, message: Any, delivery_tag: str) -> None:
        """The consumer took ``message``: its lease now lasts until the ack or reject."""
        lease = self._undelivered.pop(delivery_tag, None)
        if lease is None:
            # Received some other way (kombu's basic_get): the lease starts now.
            info = message.delivery_info
            if not info.get("sqs_queue"):
                return
            born = self._leases_from_receive(
                [info.get("sqs_message") or {"ReceiptHandle": delivery_tag}],
                info["sqs_queue"],
                self.canonical_queue_name(info.get("routing_key") or ""),
            )
            if not born:
                return
            lease = self._undelivered.pop(delivery_tag)
        headers = message.headers or {}
        lease.task_id = headers.get("id")
        lease.task_name = headers.get("task")
        self.leases[delivery_tag] = lease

    def _release_undelivered(self, leases: list[Lease]) -> None:
        """Messages received but never handed to the consumer go straight back to SQS.

        A body kombu cannot decode raises before delivery; without this its lease would be
        renewed for as long as the worker lives.
        """
        stranded = [lease for lease in leases if self._undelivered.pop(lease.receipt_handle, None)]
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
        leases = [lease for tag in delivery_tags if (lease := self.leases.pop(tag, None))]
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
            self.manager.wait_for_releases(SHUTDOWN_RELEASE_TIMEOUT)
        else:
            for lease in leases:
                self.manager.end(lease)

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        # The lease ends before the delete is sent: no renewal may start after it.
        lease = self.leases.pop(delivery_tag, None)
        if lease is not None:
            self.manager.end(lease)
        super().basic_ack(delivery_tag, multiple)

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """Release the message to SQS instead of deleting or re-publishing it.

        SQS then counts the receive and moves the message to the dead-letter queue after
        ``maxReceiveCount``: retries are bookkept where they survive the worker.
        """
        lease = self.leases.pop(delivery_tag, None)
        releasing = lease is not None and (
            requeue
            or (self.options.release_on_failure and not self.qos.is_backoff_task(delivery_tag))
        )
        if lease is None or not releasing:
            if lease is not None:
                self.manager.end(lease)
            super().basic_reject(delivery_tag, requeue)
            return
        delay = self.options.release_delay_for(lease.receive_count)
        self.manager.release([(lease, delay)], "requeue" if requeue else "failure")
        # kombu's own reject would delete the message, or re-publish it on requeue; here
        # it only has to forget the delivery.
        VirtualChannel.basic_reject(self, delivery_tag, requeue=False)


class Transport(SQS.Transport):
    """kombu's SQS transport, keeping received messages invisible until they are acked."""

    Channel = Channel

    def __init__(self, client: Any, **kwargs: Any) -> None:
        # Checked before anything connects: a bad option stops the worker at start-up.
        self.heartbeat_options = HeartbeatOptions.from_transport_options(
            client.transport_options or {}
        )
        super().__init__(client, **kwargs)
        self.lease_queues: dict[str, SQSQueue] = {}


def _running_task_ids() -> set[str]:
    """Ids of the tasks this worker has started and not finished.

    Only a Celery worker knows which received messages a pool has started; outside one
    (a plain kombu consumer), nothing counts as started.
    """
    state = sys.modules.get("celery.worker.state")
    if state is None:
        return set()
    return {request.id for request in list(state.active_requests)}
