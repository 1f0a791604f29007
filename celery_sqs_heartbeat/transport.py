"""The kombu transport: one channel class, glue between kombu's SQS channel and its parts.

:class:`Channel` overrides each kombu hook once and hands the work to the parts it builds
in its ``__init__``, in this order: the :class:`~.receiving.receiver.Receiver` (the receive
loop), the :class:`~.payloads.reader.PayloadReader` (bodies through S3), the
:class:`~.receiving.intake.Intake` (leases from the receive to the consumer's claim), the
:class:`~.settling.settler.Settler` (acks, rejects, the flush at close), the
:class:`~.publishing.send_delay.SendDelays` (countdowns delayed in SQS), the
:class:`~.publishing.sender.Sender` (batched publishes), the
:class:`~.queues.keeper.QueueKeeper` (URLs and new queues), the
:class:`~.queues.cleanup.AutoDeleteQueues`, the
:class:`~.monitoring.reply_queue_keeper.ReplyQueueKeeper`, the
:class:`~.monitoring.timely_replies.TimelyReplies` and the
:class:`~.monitoring.event_fanout.EventFanout`. Where one hook does the work of several,
their order is written in that hook, with why.

A lease from receive to confirmed delete, one step a function:

1. born in :meth:`ReceiveSteps.born <celery_sqs_heartbeat.receiving.steps.ReceiveSteps.born>`
   as the ReceiveMessage answer arrives (event loop: :meth:`Intake.messages_ready
   <celery_sqs_heartbeat.receiving.intake.Intake.messages_ready>`, from
   :meth:`Channel._on_messages_ready`; blocking path: :meth:`Intake.receive_message
   <celery_sqs_heartbeat.receiving.intake.Intake.receive_message>`, from
   :meth:`Channel._receive_message`), which hands it to the manager
   (:meth:`VisibilityExtensionManager.track`); then a message held or acked here already
   is taken out, its body is read from S3, and
   :meth:`ReceiveSteps.sort <celery_sqs_heartbeat.receiving.steps.ReceiveSteps.sort>`
   parks a far-ETA task and holds the rest in the channel's
   :class:`~celery_sqs_heartbeat.leasing.lease_table.LeaseTable`
   (:mod:`celery_sqs_heartbeat.receiving.steps` has the order and why);
2. claimed in :meth:`Intake.claim <celery_sqs_heartbeat.receiving.intake.Intake.claim>`
   (from :meth:`QoS.append`) when kombu hands the message to the consumer; what no
   consumer claimed goes back to SQS at once (``Intake.release_unclaimed``);
3. renewed by the manager's thread (:meth:`CallStarter._start_renewals
   <celery_sqs_heartbeat.leasing.call_starter.CallStarter._start_renewals>`, one call a
   thread: ``_renew``) until it ends, on the client of the live channel
   (:mod:`celery_sqs_heartbeat.leasing.lease_queues`);
4. let go at the ack, in :meth:`Settler.ack <celery_sqs_heartbeat.settling.settler.Settler.ack>`
   (from :meth:`Channel.basic_ack`), which leaves the delete in the manager's outbox
   (:meth:`VisibilityExtensionManager.delete`); a reject releases it instead
   (``Settler.reject``, :meth:`VisibilityExtensionManager.release`), and so does the
   channel's close for messages Celery will not run (:meth:`QoS.restore_unacked`);
5. ended when SQS confirms the delete: the manager's check (``CallStarter._start_sends``)
   takes it out of the outbox and the book, ``_send`` makes the call on a thread of its
   own, and ``AnswerSettler.send_answered`` ends the lease, or puts it back in the book if
   the delete failed.
"""

from __future__ import annotations

from functools import cache, partial
from typing import Any

import kombu
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import ClientError
from celery import signals
from celery.utils.log import get_logger
from kombu.asynchronous import set_event_loop
from kombu.transport import SQS, virtual
from kombu.transport.base import to_rabbitmq_queue_arguments
from kombu.utils.objects import cached_property

from .aws.sessions import client_as_kombu_makes_it
from .compat import (
    KOMBU_BROADCASTS_THROUGH_SNS,
    SQSChannel,
    cancel_timers_of_closed_http_clients,
)
from .leasing.lease_table import LeaseTable
from .leasing.leases import LeasePolicy
from .leasing.manager import VisibilityExtensionManager
from .monitoring import control  # noqa: F401  (importing registers the sqs_leases inspect commands)
from .monitoring.event_fanout import EventFanout, events_through_sns
from .monitoring.opentelemetry import register_instruments
from .monitoring.pidbox_names import reply_queue_of
from .monitoring.prometheus import start_exporter
from .monitoring.reply_queue_keeper import ReplyQueueKeeper
from .monitoring.timely_replies import TimelyReplies
from .options import HeartbeatOptions
from .payloads.options import LargePayloadOptions, PayloadAccess
from .payloads.reader import PayloadReader, ReadingQoS
from .payloads.store import PayloadStore
from .process import this_process
from .publishing.send_delay import SendDelays
from .publishing.sender import Sender
from .queues.cleanup import AutoDeleteQueues
from .queues.keeper import QueueKeeper
from .receiving.chains import most_receives_in_flight
from .receiving.intake import Intake
from .receiving.parker import Parker
from .receiving.receipt_redaction import redact_celery_reports
from .receiving.receiver import Receiver
from .receiving.steps import ReceiveSteps
from .settling.celery_requests import CeleryRequests
from .settling.settler import Settler
from .startup import (
    remote_control_notice,
    settings_line,
)
from .startup.checks import check_before_connecting, missing_queue_declared
from .startup.green_timer import mend_gevent_timer
from .startup.unavailable import SQSUnavailable, unavailable_as_connection_error

__all__ = ["Channel", "QoS", "Transport"]

logger = get_logger(__name__)


class QoS(ReadingQoS):
    """kombu's SQS QoS, with a lease for every message it holds unacked."""

    channel: Channel

    def append(self, message: Any, delivery_tag: str) -> None:
        super().append(message, delivery_tag)
        self.channel.intake.claim(message, delivery_tag)

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
            if self.channel.celery_requests.asked_to_ack(tag):
                self.channel.basic_ack(tag)
        leaving = [
            tag
            for tag, lease in delivered
            if tag in self._delivered
            and not self.channel.celery_requests.will_run(tag, lease.task_id)
        ]
        for tag in leaving:
            self._delivered.pop(tag, None)
            self.channel.celery_requests.forget(tag)
        self.channel.settler.end_leases(leaving, "shutdown")
        return []

    def _settled(self, delivery_tag: str) -> None:
        """kombu forgot the delivery: its room in the prefetch and its Celery request go."""
        self.channel.celery_requests.forget(delivery_tag)
        self.channel.receiver.prefetch_room_freed()


class Channel(SQSChannel):
    """kombu's SQS channel, holding a lease on every message it received and not acked.

    Glue only: each kombu hook is overridden here once and handed to a part; kombu's own
    step goes with it where the part goes around it. (``SQSChannel`` is kombu 5.5's
    version glue, not a feature.)
    """

    QoS = QoS
    connection: Transport

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        # Checked first: a worker that cannot start builds nothing and calls nothing.
        check_before_connecting(connection)
        # The parts, before kombu's __init__: it makes the channel's first client (its
        # ListQueues) through sqs(), which the receiver, payload reader and sender shape.
        #: Kept, not read through the connection: after a reconnect the old channel is
        #: closed and has no connection, but its running tasks still ack through it.
        self.options: HeartbeatOptions = connection.heartbeat_options
        self.manager: VisibilityExtensionManager = connection.manager
        self.lease_table = LeaseTable()
        #: Celery's request for each delivery the channel holds a lease on.
        self.celery_requests = CeleryRequests()
        self.receiver = Receiver(
            self,
            connection.clock,
            super()._schedule_queue,
            self._polling_interval,
            most_receives_in_flight(
                self.options.receives_in_flight, this_process().tasks_run_on_the_loop
            ),
        )
        self.payload_reader = PayloadReader(
            self,
            connection.payload_store,
            self.manager,
            self.lease_table,
            self.receiver.prefetch_room_freed,
        )
        self.intake = Intake(
            self,
            self.manager,
            self.lease_table,
            self._receive_steps(),
            self.receiver,
            self.payload_reader,
        )
        self.settler = Settler(
            self,
            self.options,
            self.manager,
            self.lease_table,
            self.receiver.shutdown_release_delay,
        )
        self.send_delays = SendDelays(self.options.eta_send_delay)
        self.sender = Sender(connection.payload_store, self.canonical_queue_name)
        self.queue_keeper = QueueKeeper(self)
        self.auto_delete_queues = AutoDeleteQueues(self)
        self.reply_queues = ReplyQueueKeeper(self)
        self.timely_replies = TimelyReplies(self, self._polling_interval)
        self.event_fanout = EventFanout(self)
        # kombu's __init__ lists the queues: SQS failing for a while then is retried.
        with unavailable_as_connection_error():
            super().__init__(connection, **kwargs)

    def _receive_steps(self) -> ReceiveSteps:
        policy = LeasePolicy(
            visibility_timeout=self.options.visibility_timeout,
            threshold=self.options.visibility_extension_threshold,
            max_hold=self.options.visibility_extension_max,
            renewed=self.options.visibility_extension,
        )
        parker = Parker(self.options, self.manager, policy)
        return ReceiveSteps(self.options, self.manager, self.lease_table, policy, parker)

    def _polling_interval(self) -> float:
        """kombu's wait when the window is full, or after an empty poll (kombu 5.7)."""
        return float(self.connection.polling_interval or 0)

    @cached_property
    def visibility_timeout(self) -> int:
        return self.options.visibility_timeout

    # --- clients, queues, exchanges -----------------------------------------------------

    def new_sqs_client(
        self,
        region: str | None,
        access_key_id: str | None,
        secret_access_key: str | None,
        session_token: str | None = None,
    ) -> BaseClient:
        return self._new_boto_client(
            "sqs", region, access_key_id, secret_access_key, session_token
        )

    def _new_boto_client(
        self,
        service: str,
        region: str | None,
        access_key_id: str | None,
        secret_access_key: str | None,
        session_token: str | None = None,
        config: Config | None = None,
    ) -> BaseClient:
        # kombu 5.7 makes its SQS and SNS clients here (5.5 and 5.6: SQS, in
        # new_sqs_client): the same client, on the process's one parse of botocore's data.
        return client_as_kombu_makes_it(
            service,
            region,
            access_key_id,
            secret_access_key,
            session_token,
            is_secure=self.is_secure,
            endpoint_url=self.endpoint_url,
            transport_options=self.transport_options,
            config=config,
        )

    def sqs(self, queue: str | None = None) -> BaseClient:
        # kombu's client shaped by two botocore events (independent of each other), then
        # wrapped last, for the calling thread only, while a batch scope's put runs.
        client = super().sqs(queue=queue)
        self.receiver.ask_for_lease(client)
        self.payload_reader.offload_large_bodies(client)
        return self.sender.catching(client)

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        # 1. The TTL's retention is noted before kombu may create the queue (_create_queue).
        # 2. kombu's declare, once more if the cached URL was of a deleted queue.
        # 3. An answer saying to try again later (5xx, throttled) is a connection error,
        #    which Celery retries; the start-up check sees any other error last, after
        #    that retry: a queue merely deleted and re-creatable must not stop the worker.
        # 4. The bookkeeping follows a declare that succeeded, with its final URL.
        self.queue_keeper.note_retention(queue, passive, kwargs.get("arguments"))
        declare = partial(super().queue_declare, queue, passive=passive, **kwargs)
        try:
            with unavailable_as_connection_error():
                declared = self.queue_keeper.declare(queue, passive, declare)
        except ClientError as error:
            name = self.canonical_queue_name(queue or "")
            explained = missing_queue_declared(
                name, self.predefined_queues, self._queue_cache, error
            )
            if explained is None:
                raise
            raise explained from error
        self.reply_queues.declared(declared.queue)
        self.auto_delete_queues.declared(declared.queue, bool(kwargs.get("auto_delete")), passive)
        return declared

    def prepare_queue_arguments(self, arguments: Any, **kwargs: Any) -> Any:
        """A queue's ``message_ttl`` and ``expires`` as AMQP's ``x-`` arguments, in ms."""
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

    def _create_queue(self, queue_name: str, attributes: dict[str, str]) -> Any:
        attributes = self.queue_keeper.creation_attributes(queue_name, attributes)
        return super()._create_queue(queue_name, attributes)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        # kombu's DeleteQueue first: the URL is forgotten once the queue is gone.
        super()._delete(queue, *args, **kwargs)
        self.queue_keeper.forget_url(queue)

    def queue_bind(self, *args: Any, **kwargs: Any) -> Any:
        """kombu 5.7 makes a fanout exchange's SNS topic here, and clears its subscriptions
        of queues gone: AWS failing for a while then is a connection error, retried."""
        with unavailable_as_connection_error():
            return super().queue_bind(*args, **kwargs)

    def after_reply_message_received(self, queue: str) -> None:
        self.reply_queues.after_reply_received(queue, super().after_reply_message_received)

    def typeof(self, exchange: str, default: str = "direct") -> Any:
        return self.event_fanout.exchange_type(exchange) or super().typeof(exchange, default)

    def _exchange_is_fanout(self, exchange_name: str) -> bool:
        """kombu 5.7 asks this to make the topic, subscribe a queue and unsubscribe it."""
        return self.event_fanout.routes(exchange_name) or bool(
            super()._exchange_is_fanout(exchange_name)
        )

    def _lookup(self, exchange: str, routing_key: str, default: Any = None) -> list[str]:
        """Route remote-control replies to the asking client's own reply queue.

        kombu found no binding for them in a worker, and dropped every reply.
        """
        queues: list[str] = super()._lookup(exchange, routing_key, default)
        reply_queue = None if queues else reply_queue_of(exchange, routing_key)
        return [reply_queue] if reply_queue else queues

    # --- publishing -----------------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        # 1. An ETA's delay is set in the message first: kombu's SendMessage carries it,
        #    and so does the one the sender catches inside a batch scope.
        # 2. The sender goes around the reply keeper: inside a batch scope it catches the
        #    one SendMessage kombu makes; a remote-control reply it never catches, so the
        #    reply keeper sees its send and drops a reply whose queue is gone.
        self.send_delays.set_on(queue, message)
        kombu_put = partial(super()._put, queue, message, **kwargs)
        self.sender.put(queue, message, partial(self.reply_queues.put, queue, kombu_put))

    # --- consuming ------------------------------------------------------------------------

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, *args: Any, **kwargs: Any
    ) -> Any:
        # 1. Consumers only start the exporter and register the OpenTelemetry instruments:
        #    producers never open a port, and in a prefork worker the main process, which
        #    consumes, holds and renews the leases. Before kombu's part: an exporter that
        #    cannot start stops the worker before anything was subscribed or taken.
        # 2. kombu wraps the filtered callback: its wrapper claims the lease (QoS.append)
        #    before an unwanted event is acked, so none is left leased and unacked. kombu
        #    5.7 subscribes a fanout queue to its SNS topic then: AWS failing for a while
        #    is a connection error, retried.
        start_exporter(self.options)
        register_instruments()
        if self.transport_options.get("supports_fanout") and not KOMBU_BROADCASTS_THROUGH_SNS:
            _warn_broadcast_needs_sns()
        callback = self.event_fanout.consumer_callback(queue, no_ack, callback)
        with unavailable_as_connection_error():
            return super().basic_consume(queue, no_ack, callback, *args, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        return self.auto_delete_queues.cancel(consumer_tag, super().basic_cancel)

    def basic_qos(self, *args: Any, **kwargs: Any) -> None:
        # A larger window may wake a receive loop parked for room.
        super().basic_qos(*args, **kwargs)
        self.receiver.prefetch_room_freed()

    # --- receiving: the event loop --------------------------------------------------------

    def _schedule_queue(self, queue: str) -> None:
        self.receiver.schedule_queue(queue)

    def _get_bulk_async(self, queue: str, callback: Any = None) -> Any:
        self.timely_replies.poll_sent(queue)
        return super()._get_bulk_async(queue, callback=callback)

    def _get_from_sqs(
        self,
        queue_name: str,
        queue_url: str,
        connection: Any,
        count: int = 1,
        callback: Any = None,
    ) -> Any:
        return self.receiver.get_from_sqs(queue_name, queue_url, connection, count, callback)

    def _on_messages_ready(self, queue: str, qname: str, messages: Any) -> Any:
        return self.intake.messages_ready(queue, qname, messages, super()._on_messages_ready)

    def _loop1(self, queue: str, messages_fetched: Any = None) -> None:
        # The receiver decides whether this chain of receives goes on (and whether another
        # starts beside it); a chain that goes on keeps kombu's pace, or a mailbox's.
        kombu_next_turn = partial(super()._loop1, queue, messages_fetched)
        self.receiver.next_turn(
            queue, partial(self.timely_replies.next_turn, queue, messages_fetched, kombu_next_turn)
        )

    # --- receiving: the blocking path (gevent, eventlet, plain kombu) ---------------------

    def drain_events(
        self, timeout: float | None = None, callback: Any = None, **kwargs: Any
    ) -> Any:
        # The drain's timeout is noted first, for the reply queues' receives it makes;
        # then the wait for prefetch room, then kombu's drain.
        kombu_drain = partial(super().drain_events, timeout=timeout, callback=callback, **kwargs)
        return self.timely_replies.drain(
            timeout, partial(self.receiver.blocking.drain_events, timeout, kombu_drain)
        )

    def _get_bulk(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        # The intake goes around the receiver: a receive that only parked is made again,
        # each with the receiver's in-bulk mark (its messages are leased, its no-ack
        # deletes blocking); what nobody took goes back after the last.
        kombu_get_bulk = partial(super()._get_bulk, queue, *args, **kwargs)
        return self.intake.get_bulk(partial(self.receiver.blocking.get_bulk, kombu_get_bulk))

    def _receive_message(
        self, queue: str, max_number_of_messages: int = 1, wait_time_seconds: int | None = None
    ) -> Any:
        # A reply queue's wait is bounded by its drain; the receiver makes one call or a
        # round of them side by side, each with its gate and failure handling around
        # kombu's call, inside the intake, which times the call before it is made (the
        # leases count from then) and takes every step on what it brings.
        kwargs = {
            "max_number_of_messages": max_number_of_messages,
            "wait_time_seconds": self.timely_replies.wait_for(queue, wait_time_seconds),
        }
        return self.receiver.blocking.receive_round(
            queue, kwargs, super()._receive_message, self.intake.receive_message
        )

    def _message_to_python(self, message: dict[str, Any], queue_name: str, q_url: str) -> Any:
        payload = super()._message_to_python(message, queue_name, q_url)
        return self.receiver.marked_redelivered(payload, message)

    def _delete_message(self, queue_name: str, message: dict[str, Any]) -> None:
        # kombu's delete of a no-ack message (a mailbox's), as kombu delivers it.
        outbox_delete = partial(self.intake.delete_no_ack, queue_name, message)
        self.receiver.blocking.delete_message(queue_name, message, outbox_delete)

    # --- settling -------------------------------------------------------------------------

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        self.settler.ack(delivery_tag, multiple, super().basic_ack)

    def ack_for_celery(self, delivery_tag: str) -> None:
        """Celery asked to ack during a shutdown: ack now, not when its loop turns again."""
        self.settler.ack_ahead(delivery_tag, super().basic_ack)

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self.settler.reject(delivery_tag, requeue, super().basic_reject)

    def _delete_rejected_message(self, delivery_tag: str) -> None:
        self.settler.delete_rejected(delivery_tag, super()._delete_rejected_message)

    def close(self) -> None:
        # 1. Messages still being read from S3 go back: no consumer is left to take them.
        # 2. The queues parked for prefetch room are forgotten before kombu's close, whose
        #    own acks free room that would schedule a receive on a closed channel.
        # 3. kombu's close: the consumers cancelled (a monitor's queue deleted), then
        #    QoS.restore_unacked acks what Celery asked to ack and releases the rest.
        # 4. The flush last, so the deletes and releases made above go out now, not at a
        #    later check that a process which is stopping may never run.
        self.payload_reader.close()
        self.receiver.close()
        super().close()
        self.settler.flush_at_close()


class Transport(SQS.Transport):
    """kombu's SQS transport, keeping received messages invisible until they are acked."""

    Channel = Channel

    #: kombu's, and AWS answering a channel's set-up with "later" (a 5xx, a throttle),
    #: which Celery retries as it retries a dropped connection: an ``OSError``, as
    #: kombu's ``socket.error`` is, named here for what it is. (mypy reads kombu's
    #: tuple as of exactly three errors.)
    connection_errors = (  # type: ignore[assignment]
        *SQS.Transport.connection_errors,
        SQSUnavailable,
    )

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
        healthy SQS was. The closed HTTP client's leftover timers go first: they would
        only log errors on the new loop.
        """
        cancel_timers_of_closed_http_clients(loop)
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
        "%s",
        settings_line.describe(
            transport.heartbeat_options,
            store.options,
            store.access,
            tasks_run_on_the_loop=this_process().tasks_run_on_the_loop,
        ),
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


def _stop_lost_connections_heartbeats(sender: Any, **_: Any) -> None:
    """A gevent worker of this transport: its timer made to stop the heartbeat of each
    lost connection, which held that connection and its clients (:mod:`.startup.green_timer`).

    At ``worker_ready``: Celery looks ``cancel`` up on its timer at each stop, the first
    connection's included."""
    transport = getattr(getattr(sender, "connection", None), "transport", None)
    if isinstance(transport, Transport):
        mend_gevent_timer(sender.timer)


signals.worker_ready.connect(_stop_lost_connections_heartbeats, weak=False)


@cache
def _warn_broadcast_needs_sns() -> None:
    logger.warning(
        "supports_fanout is set, but this kombu (%s) has no SNS fanout for SQS, which came "
        "in kombu 5.7: broadcasts would reach no worker, so remote control (celery "
        "inspect, celery control) stays off",
        kombu.__version__,
    )
