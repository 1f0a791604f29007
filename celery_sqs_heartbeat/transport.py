"""The kombu transport: glue between kombu's SQS channel and the lease manager.

Where a lease lives, in kombu's terms:

- born in :meth:`Channel._leases_from_receive`, as the ReceiveMessage answer arrives,
  and claimed in :meth:`QoS.append` when kombu hands the message to the consumer;
- renewed by :mod:`celery_sqs_heartbeat.manager` until it ends;
- ended when SQS confirms the delete that :meth:`Channel.basic_ack` (or a reject that
  deletes) left in the manager's outbox, or by the release of :meth:`Channel.basic_reject`,
  or released when the channel closes with messages that never started.

The receive path never ends the worker: a failed ReceiveMessage is retried with backoff
(:mod:`celery_sqs_heartbeat.receiving`), except for errors no retry can fix, which stop
the worker with the queue and the cause named.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable
from functools import cache, partial
from queue import Empty
from typing import Any, cast

import kombu
from botocore.client import BaseClient
from celery.exceptions import WorkerShutdown
from celery.platforms import EX_FAILURE
from celery.utils.log import get_logger
from kombu.asynchronous import Hub, set_event_loop
from kombu.transport import SQS
from kombu.transport.virtual import Channel as VirtualChannel
from kombu.utils.objects import cached_property
from vine import promise

from . import (
    control,  # noqa: F401  (importing registers the sqs_leases inspect commands)
    metrics,
)
from .compat import KOMBU_BROADCASTS_THROUGH_SNS, SQSChannel, is_backoff_task
from .leases import Lease, LeasePolicy
from .manager import VisibilityExtensionManager, shared_manager
from .options import HeartbeatOptions
from .prefetch import PrefetchRoom, full_call_room
from .prometheus import start_exporter
from .receiving import NO_ANSWER, ReceiveBackoff, ReceiveFailure, classify_receive_error
from .sqs import SQSQueue

__all__ = ["Channel", "QoS", "Transport"]

logger = get_logger(__name__)

#: kombu's Mailbox names a remote-control reply queue ``<routing key>.<reply exchange>``.
_PIDBOX_REPLY_EXCHANGE = re.compile(r"reply\..+\.pidbox")

#: How long closing a channel waits for pending deletes and releases to be confirmed.
SHUTDOWN_FLUSH_TIMEOUT = 10.0

#: The longest the blocking receive loop waits in one call for the window to free up.
FULL_WINDOW_WAIT = 0.1


class QoS(SQS.QoS):
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
            for tag, lease in self.channel.leases.items()
            if tag in self._delivered and lease.task_id not in running
        ]
        for tag in leaving:
            self._delivered.pop(tag, None)
        self.channel.end_leases(leaving, "shutdown")
        return []


class Channel(SQSChannel):
    """kombu's SQS channel, asking for the transport's lease on every receive."""

    QoS = QoS
    connection: Transport

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Kept, not read through the connection: after a reconnect the old channel is
        #: closed and has no connection, but its running tasks still ack through it.
        self.options: HeartbeatOptions = self.connection.heartbeat_options
        #: Leases of the messages this channel delivered and that are not acked yet,
        #: by delivery tag (the receipt handle).
        self.leases: dict[str, Lease] = {}
        #: Leases of messages received from SQS but not yet handed to the consumer.
        self._undelivered: dict[str, Lease] = {}
        self._bulk_leases: list[Lease] | None = None
        #: The delivery tag of every message held here, by SQS message id.
        self._tags_by_message_id: dict[str, str] = {}
        self._receive_backoff = ReceiveBackoff()
        #: When each queue's pending long poll was sent, by queue URL.
        self._polls_pending: dict[str, float] = {}
        self._prefetch_room = PrefetchRoom(
            lambda: self.qos.can_consume_max_estimate(),
            self._room_worth_a_receive,
            lambda: self._patience,
        )

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

    def _delete_message(self, queue_name: str, message: dict[str, Any]) -> None:
        """Delete a no-ack message; without an event loop (``celery inspect``), blocking."""
        if self.hub is not None:
            super()._delete_message(queue_name, message)
            return
        self.sqs(queue=queue_name).delete_message(
            QueueUrl=self._new_queue(queue_name), ReceiptHandle=message["ReceiptHandle"]
        )

    def _schedule_queue(self, queue: str) -> None:
        """The worker's receive loop, one turn per queue: wait out a failing queue's backoff.

        kombu's loop stops for good when a receive raises, and kombu 5.7 ends the worker
        when SQS answers with an error; here a failed turn only delays the next one.
        """
        if queue in self._active_queues:
            wait = self._receive_backoff.wait(self.canonical_queue_name(queue), self._now())
            if wait > 0:
                self._event_loop.call_later(wait, self._schedule_queue, queue)
                return
            parked = self._prefetch_room.park(queue)
            if parked is not None:
                # Woken by prefetch_room_freed; kombu's own wait is the longest it waits.
                self._event_loop.call_later(
                    self._patience, self._settle_for_any_room, queue, parked
                )
                return
        self._receive_now(queue)

    def _receive_now(self, queue: str) -> None:
        """kombu's turn: a receive if the window has any room, else kombu's own wait."""
        try:
            super()._schedule_queue(queue)
        except Exception as exc:
            # Before anything was sent: the queue's URL or the client could not be had.
            self._receive_failed(self.canonical_queue_name(queue), classify_receive_error(exc))
            self._event_loop.call_soon(self._schedule_queue, queue)

    def _settle_for_any_room(self, queue: str, parked: int) -> None:
        if self._prefetch_room.settle_for_any_room(queue, parked):
            self._receive_now(queue)

    def prefetch_room_freed(self) -> None:
        """An ack or reject freed a slot (from the hub, a pool thread or a greenlet).

        A woken queue receives at once, not through another turn of the loop, which
        would park it again when kombu's wait settled it for less than a full call.
        """
        for queue in self._prefetch_room.freed():
            self._event_loop.call_soon(self._receive_now, queue)

    def _room_worth_a_receive(self, queue: str | None) -> int:
        """A full call's room, except on FIFO queues, which receive one at a time."""
        names = [queue] if queue is not None else list(self._active_queues)
        full = full_call_room(self.qos.prefetch_count)
        return min((_receive_size(self.canonical_queue_name(q), full) for q in names), default=full)

    @property
    def _patience(self) -> float:
        """kombu's wait when the window is full: ``polling_interval``."""
        return float(self.connection.polling_interval or 0)

    def drain_events(
        self, timeout: float | None = None, callback: Any = None, **kwargs: Any
    ) -> Any:
        """The blocking receive loop (gevent, eventlet): wait for room, not a whole second.

        kombu raises Empty when the window is full, and its transport then sleeps
        ``polling_interval`` whatever the acks do meanwhile. Here the wait ends with the
        ack that frees the room; but it is short, and ends with ``socket.timeout`` (TimeoutError) so
        the caller's loop runs again: Celery before 5.7 performs a green pool's acks in
        that loop, between two calls of this method.
        """
        if self._consumers:
            wait = 0.0 if timeout is None else min(timeout, FULL_WINDOW_WAIT)
            if not self._prefetch_room.wait(wait):
                if timeout is None:
                    raise Empty()
                raise TimeoutError()
        return super().drain_events(timeout=timeout, callback=callback, **kwargs)

    def basic_qos(self, *args: Any, **kwargs: Any) -> None:
        super().basic_qos(*args, **kwargs)
        self.prefetch_room_freed()

    def _get_from_sqs(
        self,
        queue_name: str,
        queue_url: str,
        connection: Any,
        count: int = 1,
        callback: Any = None,
    ) -> Any:
        """Send the asynchronous long poll; whatever comes back keeps the loop going."""
        self._polls_pending[queue_url] = self._now()
        answered = promise(
            self._on_receive_answer,
            (queue_name, queue_url, callback),
            on_error=self._on_receive_error,
        )
        connection.receive_message(
            queue_name,
            queue_url,
            number_messages=_receive_size(queue_name, count),
            visibility_timeout=self.visibility_timeout,
            wait_time_seconds=self.wait_time_seconds,
            callback=answered,
        )
        return answered

    def _on_receive_answer(
        self, queue_name: str, queue_url: str, callback: Any, answer: Any
    ) -> None:
        self._polls_pending.pop(queue_url, None)
        if isinstance(answer, dict):
            self._receive_succeeded(queue_name)
        else:
            # kombu's client turns a 5xx, a timeout or a dropped connection into a list.
            self._receive_failed(queue_name, NO_ANSWER)
            answer = {}
        # Delivered now, as kombu does: deferred to the next turn of the hub, a threads
        # pool's hub (no file descriptor to wait on) would first sleep up to 0.1 s, on
        # every receive. An error while delivering is kombu's or Celery's, not the
        # receive's: it is raised again from the hub, outside this promise, whose
        # on_error would take it for a failed receive.
        try:
            callback(answer)
        except Exception as exc:
            self._event_loop.call_soon(partial(_raise, exc))

    def _on_receive_error(
        self, queue_name: str, queue_url: str, callback: Any, error: BaseException
    ) -> None:
        self._polls_pending.pop(queue_url, None)
        self._receive_failed(queue_name, classify_receive_error(error))
        # An empty answer lets kombu schedule the next turn, which waits out the backoff.
        self._event_loop.call_soon(partial(callback, {}))

    def _receive_message(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """The blocking receive (gevent, eventlet, plain kombu): failures read as empty."""
        queue_name = self.canonical_queue_name(queue)
        if self._receive_backoff.wait(queue_name, self._now()) > 0:
            raise Empty()
        if "max_number_of_messages" in kwargs:
            kwargs["max_number_of_messages"] = _receive_size(
                queue_name, kwargs["max_number_of_messages"]
            )
        try:
            response = super()._receive_message(queue, *args, **kwargs)
        except Exception as exc:
            self._receive_failed(queue_name, classify_receive_error(exc))
            raise Empty() from None
        self._receive_succeeded(queue_name)
        if self._bulk_leases is not None and queue not in self._noack_queues:
            received = response.get("Messages") or []
            to_deliver, leases = self._leases_from_receive(received, self._new_queue(queue), queue)
            response["Messages"] = to_deliver
            self._bulk_leases.extend(leases)
        return response

    def _receive_failed(self, queue_name: str, failure: ReceiveFailure) -> None:
        metrics.record_receive_error(failure.code)
        if failure.fatal:
            logger.critical(
                "Cannot receive from SQS queue %s (%s): retrying cannot fix this, so the "
                "worker stops. Check the queue name, the region, the credentials and "
                "their IAM permissions.",
                queue_name,
                failure,
            )
            raise WorkerShutdown(EX_FAILURE)
        if self._receive_backoff.failed(queue_name, self._now()):
            logger.warning(
                "Receiving from SQS queue %s failed (%s); retrying with backoff until it works",
                queue_name,
                failure,
            )

    def _receive_succeeded(self, queue_name: str) -> None:
        recovery = self._receive_backoff.succeeded(queue_name, self._now())
        if recovery is not None:
            logger.info(
                "Receiving from SQS queue %s works again, after %d failed attempt(s) in %.1f s",
                queue_name,
                recovery.failures,
                recovery.seconds,
            )

    @property
    def _event_loop(self) -> Hub:
        # Only the asynchronous receive path uses it, and kombu takes that path only
        # when the channel has an event loop.
        return cast(Hub, self.hub)

    def _now(self) -> float:
        return self.manager.clock()

    def _shutdown_release_delay(self, queue_url: str) -> int:
        """Seconds until this channel's own pending long poll on the queue must be over.

        Released earlier, a message could be handed to that poll, whose answer nobody
        reads any more once the worker stops: it would stay hidden for a whole lease.
        """
        sent_at = self._polls_pending.get(queue_url)
        if sent_at is None:
            return 0
        return max(0, math.ceil(sent_at + int(self.wait_time_seconds) - self._now()))

    def _on_messages_ready(self, queue: str, qname: str, messages: Any) -> Any:
        """The worker's receive path: leases for the whole batch, then kombu's delivery.

        kombu hands the batch to the consumer one message at a time, and in the solo pool
        each task runs before the next message is handed over. So every message's lease
        starts here, when SQS's lease starts, not when the consumer gets to it.
        """
        leases: list[Lease] = []
        received = messages.get("Messages") or []
        if received and qname in self.connection._callbacks and qname not in self._noack_queues:
            messages["Messages"], leases = self._leases_from_receive(received, queue, qname)
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

    def _leases_from_receive(
        self, received: list[dict[str, Any]], queue_url: str, queue_name: str
    ) -> tuple[list[dict[str, Any]], list[Lease]]:
        """Leases are born: SQS has just started hiding these messages from others.

        Returns the messages to hand to the consumer, and their leases. A message this
        channel holds already is not handed over twice: its lease lapsed (an outage
        longer than a lease) and SQS gave it out again, maybe to this very worker.
        Then the task in progress keeps running here, on the new lease. Opting out of
        renewals opts out of this too: kombu's own behaviour, redeliveries and all. A
        message acked here whose delete has not landed yet is not run again either: the
        delete is sent by the new receipt.
        """
        now = self._now()
        to_deliver: list[dict[str, Any]] = []
        born: list[Lease] = []
        for sqs_message in received:
            handle = sqs_message.get("ReceiptHandle")
            if not handle:
                to_deliver.append(sqs_message)
                continue
            attributes = sqs_message.get("Attributes") or {}
            lease = Lease(
                receipt_handle=handle,
                queue=self._lease_queue(queue_url, queue_name),
                policy=self.lease_policy,
                received_at=now,
                message_id=sqs_message.get("MessageId"),
                receive_count=_receive_count(attributes),
            )
            if self.options.visibility_extension:
                self.manager.track(lease, self.options.visibility_extension_interval)
                if self._adopt_redelivery(lease):
                    continue
            if self.manager.redirect_delete(lease):
                logger.warning(
                    "SQS delivered message %s again after this worker acked it and before "
                    "its delete landed (%s); it is deleted by the new receipt, not run again",
                    lease.message_id,
                    lease.describe(),
                )
                continue
            self._hold(handle, lease)
            to_deliver.append(sqs_message)
            born.append(lease)
        return to_deliver, born

    def _adopt_redelivery(self, lease: Lease) -> bool:
        """If ``lease`` is a new receive of a message held here, move the holder onto it."""
        tag = self._tags_by_message_id.get(lease.message_id or "")
        held = self.leases.get(tag) or self._undelivered.get(tag) if tag else None
        if tag is None or held is None:
            return False
        self.manager.end(held)
        lease.task_id, lease.task_name = held.task_id, held.task_name
        if tag in self.leases:
            self.leases[tag] = lease
        else:
            self._undelivered[tag] = lease
        logger.warning(
            "SQS delivered message %s again while this worker still holds it (%s); it is not "
            "run twice here, and its lease continues on the new receipt",
            lease.message_id,
            held.describe(),
        )
        return True

    def _hold(self, tag: str, lease: Lease) -> None:
        self._undelivered[tag] = lease
        if lease.message_id:
            self._tags_by_message_id[lease.message_id] = tag

    def _let_go(self, tag: str) -> Lease | None:
        """Forget a delivered message (acked, rejected or released); its lease, if any."""
        lease = self.leases.pop(tag, None)
        if lease is not None and lease.message_id:
            self._tags_by_message_id.pop(lease.message_id, None)
        return lease

    def claim_lease(self, message: Any, delivery_tag: str) -> None:
        """The consumer took ``message``: its lease now lasts until the ack or reject."""
        lease = self._undelivered.pop(delivery_tag, None)
        if lease is None:
            # Received some other way (kombu's basic_get): the lease starts now.
            info = message.delivery_info
            if not info.get("sqs_queue"):
                return
            sqs_message = info.get("sqs_message") or {"ReceiptHandle": delivery_tag}
            _, born = self._leases_from_receive(
                [sqs_message],
                info["sqs_queue"],
                self.canonical_queue_name(info.get("routing_key") or ""),
            )
            if not born:
                return
            lease = born[0]
            self._undelivered.pop(lease.receipt_handle, None)
            if lease.message_id:
                self._tags_by_message_id[lease.message_id] = delivery_tag
        headers = message.headers or {}
        lease.task_id = headers.get("id")
        lease.task_name = headers.get("task")
        self.leases[delivery_tag] = lease

    def _release_undelivered(self, leases: list[Lease]) -> None:
        """Messages received but never handed to the consumer go straight back to SQS.

        A body kombu cannot decode raises before delivery; without this its lease would be
        renewed for as long as the worker lives.
        """
        # Keyed by the handle of the receive; the lease may since be a newer receive's.
        stranded = [
            held for lease in leases if (held := self._undelivered.pop(lease.receipt_handle, None))
        ]
        for lease in stranded:
            if lease.message_id:
                self._tags_by_message_id.pop(lease.message_id, None)
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
        leases = [lease for tag in delivery_tags if (lease := self._let_go(tag))]
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
        lease = self._let_go(delivery_tag)
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
        lease = self.leases.get(delivery_tag)
        releasing = lease is not None and (
            requeue
            or (self.options.release_on_failure and not is_backoff_task(self.qos, delivery_tag))
        )
        if lease is None or not releasing:
            # kombu deletes the message here unless the queue has a dead-letter queue,
            # through _delete_rejected_message, which hands the delete to the outbox.
            super().basic_reject(delivery_tag, requeue)
            lease = self._let_go(delivery_tag)
            if lease is not None:
                self.manager.end(lease)
            return
        self._let_go(delivery_tag)
        delay = self.options.release_delay_for(lease.receive_count)
        self.manager.release(
            [(lease, delay)], "requeue" if requeue else "failure", self._batch_wait(lease)
        )
        # kombu's own reject would delete the message, or re-publish it on requeue; here
        # it only has to forget the delivery.
        VirtualChannel.basic_reject(self, delivery_tag, requeue=False)

    def _delete_rejected_message(self, delivery_tag: str) -> None:
        """kombu deletes a message rejected without requeue: through the outbox here."""
        lease = self.leases.get(delivery_tag)
        if lease is None or not self.options.ack_batching:
            if lease is not None:
                self._point_kombu_at(delivery_tag, lease)
            super()._delete_rejected_message(delivery_tag)
            return
        queue = cast(SQSQueue, lease.queue)
        if self._has_redrive_policy(queue.name, queue.url):
            return  # SQS moves it to the dead-letter queue after maxReceiveCount
        self._let_go(delivery_tag)
        self.manager.delete(lease, self._batch_wait(lease))

    def _batch_wait(self, lease: Lease) -> float:
        """How long a delete or release may wait for company in its batch call.

        A FIFO queue holds back the rest of a message group until the message is
        deleted, so its deletes go out at once (with whatever of the queue is waiting).
        """
        if cast(SQSQueue, lease.queue).name.endswith(".fifo"):
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
        self._prefetch_room.forget()
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
        super().__init__(client, **kwargs)
        self.lease_queues: dict[str, SQSQueue] = {}
        if (client.transport_options or {}).get("supports_fanout") and KOMBU_BROADCASTS_THROUGH_SNS:
            # Broadcasts go through SNS then; saying so is what makes Celery start remote
            # control, which kombu's SQS transport never declares.
            self.implements = self.implements.extend(exchange_type=frozenset({"direct", "fanout"}))

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


def _receive_size(queue_name: str, wanted: int) -> int:
    """How many messages one ReceiveMessage asks for.

    SQS answers with several messages of one FIFO group at once, and Celery would run them
    side by side in its pool. One at a time, SQS's group lock keeps the order: the next
    message of a group comes only after the one before it is deleted or released.
    """
    return 1 if queue_name.endswith(".fifo") else wanted


def _raise(error: BaseException) -> None:
    raise error


def _receive_count(attributes: dict[str, Any]) -> int:
    try:
        return int(attributes.get("ApproximateReceiveCount", 1))
    except (TypeError, ValueError):
        return 1


def _running_task_ids() -> set[str]:
    """Ids of the tasks this worker has started and not finished.

    Only a Celery worker knows which received messages a pool has started; outside one
    (a plain kombu consumer), nothing counts as started.
    """
    state = sys.modules.get("celery.worker.state")
    if state is None:
        return set()
    return {request.id for request in list(state.active_requests)}
