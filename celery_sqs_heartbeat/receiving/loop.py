"""kombu's SQS receive loop, made to survive SQS and to receive as soon as there is room.

Where kombu's loop stops for good when a receive raises (kombu 5.7 ends the worker when
SQS answers with an error), a failed turn here only delays the next one: a failed
ReceiveMessage is retried with backoff (:mod:`celery_sqs_heartbeat.receiving.retries`), except
for errors no retry can fix, which stop the worker with the queue and the cause named.

Where kombu looks again only ``polling_interval`` after the prefetch window filled, the
loop here parks a queue until an ack frees room for a full call
(:mod:`celery_sqs_heartbeat.receiving.prefetch`), and then receives at once.

Every receive asks SQS for the channel's ``visibility_timeout`` as its lease, whatever
the queue's attribute says. Beyond that, this class knows nothing of leases:
:class:`celery_sqs_heartbeat.transport.Channel`, built on it, takes a lease for what
the receives bring.
"""

from __future__ import annotations

from functools import partial
from queue import Empty
from typing import Any, cast

from botocore.client import BaseClient
from celery.exceptions import WorkerShutdown
from celery.platforms import EX_FAILURE
from celery.utils.log import get_logger
from kombu.asynchronous import Hub
from vine import promise

from ..aws.sqs_facts import is_fifo
from ..compat import SQSChannel, call_soon_waking
from ..process import this_process
from .gate import ReceiveGate
from .prefetch import PrefetchRoom, full_call_room
from .redelivery import mark_redelivered
from .retries import NO_ANSWER, ReceiveFailure, classify_receive_error, ends_worker

__all__ = ["ReceivingChannel"]

logger = get_logger(__name__)

#: The longest the blocking receive loop waits in one call for the window to free up.
FULL_WINDOW_WAIT = 0.1


class ReceivingChannel(SQSChannel):
    """kombu's SQS channel with a receive loop that backs off, and wakes on freed room."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._receive_gate = ReceiveGate(self.connection.clock)
        #: While an answer of the event loop's long poll is being handed over: when its
        #: ReceiveMessage was sent. SQS started the messages' leases at some point since.
        self.answer_sent_at: float | None = None
        self._prefetch_room = PrefetchRoom(
            lambda: self.qos.can_consume_max_estimate(),
            self._room_worth_a_receive,
            lambda: self._patience,
        )
        self._receiving_in_bulk = False

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

    def _message_to_python(self, message: dict[str, Any], queue_name: str, q_url: str) -> Any:
        """kombu's decoded message, marked redelivered when SQS delivered it before."""
        return mark_redelivered(super()._message_to_python(message, queue_name, q_url), message)

    def _get_bulk(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """The blocking receive path (no event loop: gevent, eventlet, plain kombu)."""
        self._receiving_in_bulk = True
        try:
            return super()._get_bulk(queue, *args, **kwargs)
        finally:
            self._receiving_in_bulk = False

    def _delete_message(self, queue_name: str, message: dict[str, Any]) -> None:
        """Delete a no-ack message; blocking unless it came on the event loop.

        A blocking receive may run outside the loop's thread: a task that pings the
        workers, in a threads pool, on a channel that took the worker's loop when it was
        made. The loop's HTTP client belongs to the loop's thread (``pycurl.error: cannot
        add/remove handle - multi_perform() already running`` from any other).
        """
        if self.hub is not None and not self._receiving_in_bulk:
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
            wait = self._receive_gate.wait(self.canonical_queue_name(queue))
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
            call_soon_waking(self._event_loop, self._receive_now, queue)

    def _room_worth_a_receive(self, queue: str | None) -> int:
        """A full call's room, except on FIFO queues, which receive one at a time."""
        names = [queue] if queue is not None else list(self._active_queues)
        full = full_call_room(self.qos.prefetch_count)
        return min((receive_size(self.canonical_queue_name(q), full) for q in names), default=full)

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
        self._receive_gate.poll_sent(queue_url)
        answered = promise(
            self._on_receive_answer,
            (queue_name, queue_url, callback),
            on_error=self._on_receive_error,
        )
        self._send_long_poll(
            queue_name, queue_url, connection, receive_size(queue_name, count), answered
        )
        return answered

    def _on_receive_answer(
        self, queue_name: str, queue_url: str, callback: Any, answer: Any
    ) -> None:
        sent_at = self._receive_gate.poll_answered(queue_url)
        if self.closed:
            # Closed while the poll was out (see _next_turn): nobody takes the messages,
            # and SQS shows them again when their visibility timeout ends.
            return
        if isinstance(answer, dict):
            self._receive_gate.succeeded(queue_name)
        else:
            # kombu's client turns a 5xx, a timeout or a dropped connection into a list.
            self._receive_failed(queue_name, NO_ANSWER)
            answer = {}
        # Delivered now, as kombu does: deferred to the next turn of the hub, a threads
        # pool's hub (no file descriptor to wait on) would first sleep up to 0.1 s, on
        # every receive. An error while delivering is kombu's or Celery's, not the
        # receive's: it is raised again from the hub, outside this promise, whose
        # on_error would take it for a failed receive.
        self.answer_sent_at = sent_at
        try:
            callback(answer)
        except Exception as exc:
            self._event_loop.call_soon(partial(_raise, exc))
        finally:
            self.answer_sent_at = None

    def _on_receive_error(
        self, queue_name: str, queue_url: str, callback: Any, error: BaseException
    ) -> None:
        self._receive_gate.poll_answered(queue_url)
        self._receive_failed(queue_name, classify_receive_error(error))
        # An empty answer lets kombu schedule the next turn, which waits out the backoff.
        self._event_loop.call_soon(partial(self._next_turn, callback))

    def _next_turn(self, callback: Any) -> None:
        """kombu's next turn after a failed receive, unless the channel closed meanwhile.

        A client's channel on the worker's loop (a task that pings the workers, in a
        threads pool) is closed by the client when it has its answers, while its poll is
        out; kombu's next turn reads the closed channel's connection, and that error
        ended the worker.
        """
        if not self.closed:
            callback({})

    def _receive_message(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        """The blocking receive (gevent, eventlet, plain kombu): failures read as empty."""
        queue_name = self.canonical_queue_name(queue)
        if self._receive_gate.wait(queue_name) > 0:
            raise Empty()
        if "max_number_of_messages" in kwargs:
            kwargs["max_number_of_messages"] = receive_size(
                queue_name, kwargs["max_number_of_messages"]
            )
        try:
            response = super()._receive_message(queue, *args, **kwargs)
        except Exception as exc:
            self._receive_failed(queue_name, classify_receive_error(exc))
            raise Empty() from None
        self._receive_gate.succeeded(queue_name)
        return response

    def _receive_failed(self, queue_name: str, failure: ReceiveFailure) -> None:
        this_process().metrics.record_receive_error(failure.code)
        if failure.fatal and not ends_worker(failure, queue_name):
            logger.warning(
                "SQS queue %s is gone (%s): Celery creates and deletes its remote-control "
                "queues itself, so this channel stops receiving from it and goes on",
                queue_name,
                failure,
            )
            self._stop_receiving(queue_name)
            return
        if failure.fatal:
            logger.critical(
                "Cannot receive from SQS queue %s (%s): retrying cannot fix this, so the "
                "worker stops. Check the queue name, the region, the credentials and "
                "their IAM permissions.",
                queue_name,
                failure,
            )
            raise WorkerShutdown(EX_FAILURE)
        self._receive_gate.failed(queue_name, failure)

    def _stop_receiving(self, queue_name: str) -> None:
        """Cancel the consumers of ``queue_name``: kombu then polls it no more."""
        for tag, queue in list(self._tag_to_queue.items()):
            if self.canonical_queue_name(queue) == queue_name:
                self.basic_cancel(tag)

    @property
    def _event_loop(self) -> Hub:
        # Only the asynchronous receive path uses it, and kombu takes that path only
        # when the channel has an event loop.
        return cast(Hub, self.hub)

    def _shutdown_release_delay(self, queue_url: str) -> int:
        """Seconds a message released at shutdown waits: see :class:`ReceiveGate`."""
        return self._receive_gate.release_delay(queue_url, int(self.wait_time_seconds))

    def close(self) -> None:
        self._prefetch_room.forget()
        super().close()


def receive_size(queue_name: str, wanted: int) -> int:
    """How many messages one ReceiveMessage asks for.

    SQS answers with several messages of one FIFO group at once, and Celery would run them
    side by side in its pool. One at a time, SQS's group lock keeps the order: the next
    message of a group comes only after the one before it is deleted or released.
    """
    return 1 if is_fifo(queue_name) else wanted


def _raise(error: BaseException) -> None:
    raise error
