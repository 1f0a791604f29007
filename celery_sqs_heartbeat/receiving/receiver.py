"""The receive loop of a channel, made to survive SQS and to receive as soon as there is room.

Where kombu's loop stops for good when a receive raises (kombu 5.7 ends the worker when
SQS answers with an error), a failed turn here only delays the next one: a failed
ReceiveMessage is retried with backoff (:mod:`celery_sqs_heartbeat.receiving.retries`), except
for errors no retry can fix, which stop the worker with the queue and the cause named.

Where kombu looks again only ``polling_interval`` after the prefetch window filled, the
loop here parks a queue until an ack frees room for a full call
(:mod:`celery_sqs_heartbeat.receiving.prefetch`), and then receives at once.

Every receive asks SQS for the channel's ``visibility_timeout`` as its lease, whatever
the queue's attribute says. Beyond that, this part knows nothing of leases: the
channel's :class:`~celery_sqs_heartbeat.receiving.intake.Intake` takes a lease for what
the receives bring. The channel calls in here from its kombu hooks, handing over kombu's
own step where this part goes around it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from queue import Empty
from typing import Any, Protocol, cast

from botocore.client import BaseClient
from celery.exceptions import WorkerShutdown
from celery.platforms import EX_FAILURE
from celery.utils.log import get_logger
from kombu.asynchronous import Hub
from vine import promise

from ..aws.sqs_facts import is_fifo
from ..compat import call_soon_waking
from ..process import this_process
from .gate import ReceiveGate
from .prefetch import PrefetchRoom, full_call_room
from .redelivery import mark_redelivered
from .retries import NO_ANSWER, ReceiveFailure, classify_receive_error, ends_worker

__all__ = ["FULL_WINDOW_WAIT", "Receiver", "ReceivingPort", "receive_size"]

logger = get_logger(__name__)

#: The longest the blocking receive loop waits in one call for the window to free up.
FULL_WINDOW_WAIT = 0.1


class ReceivingPort(Protocol):
    """What the receiver reads of, and asks of, its kombu channel."""

    @property
    def hub(self) -> Any: ...

    @property
    def closed(self) -> bool: ...

    @property
    def qos(self) -> Any: ...

    @property
    def visibility_timeout(self) -> int: ...

    @property
    def wait_time_seconds(self) -> int: ...

    @property
    def _active_queues(self) -> list[str]: ...

    @property
    def _tag_to_queue(self) -> dict[str, str]: ...

    @property
    def _consumers(self) -> set[str]: ...

    def canonical_queue_name(self, queue_name: str) -> str: ...

    def basic_cancel(self, consumer_tag: str) -> Any: ...

    def sqs(self, queue: str | None = None) -> BaseClient: ...

    def _new_queue(self, queue: str) -> str: ...

    def _send_long_poll(
        self, queue_name: str, queue_url: str, connection: Any, count: int, answered: Any
    ) -> None: ...


class Receiver:
    """One channel's receive loop: backoff on failures, waking on freed prefetch room.

    ``kombu_turn`` is kombu's own turn of the event loop on a queue
    (``SQS.Channel._schedule_queue``), which the receiver calls when the queue may
    receive; ``polling_interval`` is kombu's wait when the window is full.
    """

    def __init__(
        self,
        channel: ReceivingPort,
        clock: Callable[[], float],
        kombu_turn: Callable[[str], None],
        polling_interval: Callable[[], float],
    ) -> None:
        self._channel = channel
        self._kombu_turn = kombu_turn
        self._polling_interval = polling_interval
        self._gate = ReceiveGate(clock)
        #: While an answer of the event loop's long poll is being handed over: when its
        #: ReceiveMessage was sent. SQS started the messages' leases at some point since.
        self.answer_sent_at: float | None = None
        self._prefetch_room = PrefetchRoom(
            lambda: channel.qos.can_consume_max_estimate(),
            self._room_worth_a_receive,
            polling_interval,
        )
        #: Whether the blocking receive path (kombu's ``_get_bulk``) is running.
        self.in_bulk = False

    def ask_for_lease(self, client: BaseClient) -> None:
        """Make ``client``'s ReceiveMessage ask for the channel's lease, unless the caller set one.

        Without it SQS applies the queue's attribute, which may be hours: the lease
        must be the one the manager renews.
        """
        client.meta.events.register(
            "provide-client-params.sqs.ReceiveMessage",
            self._ask_for_lease,
            unique_id="celery_sqs_heartbeat.visibility_timeout",
        )

    def _ask_for_lease(self, params: dict[str, Any], **_: Any) -> None:
        params.setdefault("VisibilityTimeout", self._channel.visibility_timeout)

    @staticmethod
    def marked_redelivered(payload: Any, message: dict[str, Any]) -> Any:
        """kombu's decoded message, marked redelivered when SQS delivered it before."""
        return mark_redelivered(payload, message)

    def get_bulk(self, kombu_get_bulk: Callable[[], Any]) -> Any:
        """The blocking receive path (no event loop: gevent, eventlet, plain kombu)."""
        self.in_bulk = True
        try:
            return kombu_get_bulk()
        finally:
            self.in_bulk = False

    def delete_message(
        self, queue_name: str, message: dict[str, Any], kombu_delete: Callable[[], None]
    ) -> None:
        """Delete a no-ack message; blocking unless it came on the event loop.

        A blocking receive may run outside the loop's thread: a task that pings the
        workers, in a threads pool, on a channel that took the worker's loop when it was
        made. The loop's HTTP client belongs to the loop's thread (``pycurl.error: cannot
        add/remove handle - multi_perform() already running`` from any other).
        """
        if self._channel.hub is not None and not self.in_bulk:
            kombu_delete()
            return
        self._channel.sqs(queue=queue_name).delete_message(
            QueueUrl=self._channel._new_queue(queue_name), ReceiptHandle=message["ReceiptHandle"]
        )

    def schedule_queue(self, queue: str) -> None:
        """The worker's receive loop, one turn per queue: wait out a failing queue's backoff.

        kombu's loop stops for good when a receive raises, and kombu 5.7 ends the worker
        when SQS answers with an error; here a failed turn only delays the next one.
        """
        if queue in self._channel._active_queues:
            wait = self._gate.wait(self._channel.canonical_queue_name(queue))
            if wait > 0:
                self._event_loop.call_later(wait, self.schedule_queue, queue)
                return
            parked = self._prefetch_room.park(queue)
            if parked is not None:
                # Woken by prefetch_room_freed; kombu's own wait is the longest it waits.
                self._event_loop.call_later(
                    self._polling_interval(), self._settle_for_any_room, queue, parked
                )
                return
        self._receive_now(queue)

    def _receive_now(self, queue: str) -> None:
        """kombu's turn: a receive if the window has any room, else kombu's own wait."""
        try:
            self._kombu_turn(queue)
        except Exception as exc:
            # Before anything was sent: the queue's URL or the client could not be had.
            name = self._channel.canonical_queue_name(queue)
            self._receive_failed(name, classify_receive_error(exc))
            self._event_loop.call_soon(self.schedule_queue, queue)

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
        channel = self._channel
        names = [queue] if queue is not None else list(channel._active_queues)
        full = full_call_room(channel.qos.prefetch_count)
        return min(
            (receive_size(channel.canonical_queue_name(q), full) for q in names), default=full
        )

    def drain_events(self, timeout: float | None, kombu_drain: Callable[[], Any]) -> Any:
        """The blocking receive loop (gevent, eventlet): wait for room, not a whole second.

        kombu raises Empty when the window is full, and its transport then sleeps
        ``polling_interval`` whatever the acks do meanwhile. Here the wait ends with the
        ack that frees the room; but it is short, and ends with ``socket.timeout``
        (TimeoutError) so the caller's loop runs again: Celery before 5.7 performs a
        green pool's acks in that loop, between two calls of this method.
        """
        if self._channel._consumers:
            wait = 0.0 if timeout is None else min(timeout, FULL_WINDOW_WAIT)
            if not self._prefetch_room.wait(wait):
                if timeout is None:
                    raise Empty()
                raise TimeoutError()
        return kombu_drain()

    def get_from_sqs(
        self, queue_name: str, queue_url: str, connection: Any, count: int, callback: Any
    ) -> Any:
        """Send the asynchronous long poll; whatever comes back keeps the loop going."""
        self._gate.poll_sent(queue_url)
        answered = promise(
            self._on_receive_answer,
            (queue_name, queue_url, callback),
            on_error=self._on_receive_error,
        )
        self._channel._send_long_poll(
            queue_name, queue_url, connection, receive_size(queue_name, count), answered
        )
        return answered

    def _on_receive_answer(
        self, queue_name: str, queue_url: str, callback: Any, answer: Any
    ) -> None:
        sent_at = self._gate.poll_answered(queue_url)
        if self._channel.closed:
            # Closed while the poll was out (see _next_turn): nobody takes the messages,
            # and SQS shows them again when their visibility timeout ends.
            return
        if isinstance(answer, dict):
            self._gate.succeeded(queue_name)
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
        self._gate.poll_answered(queue_url)
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
        if not self._channel.closed:
            callback({})

    def receive_message(
        self, queue: str, kwargs: dict[str, Any], kombu_receive: Callable[..., Any]
    ) -> Any:
        """The blocking receive (gevent, eventlet, plain kombu): failures read as empty."""
        queue_name = self._channel.canonical_queue_name(queue)
        if self._gate.wait(queue_name) > 0:
            raise Empty()
        if "max_number_of_messages" in kwargs:
            kwargs["max_number_of_messages"] = receive_size(
                queue_name, kwargs["max_number_of_messages"]
            )
        try:
            response = kombu_receive(queue, **kwargs)
        except Exception as exc:
            self._receive_failed(queue_name, classify_receive_error(exc))
            raise Empty() from None
        self._gate.succeeded(queue_name)
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
        self._gate.failed(queue_name, failure)

    def _stop_receiving(self, queue_name: str) -> None:
        """Cancel the consumers of ``queue_name``: kombu then polls it no more."""
        channel = self._channel
        for tag, queue in list(channel._tag_to_queue.items()):
            if channel.canonical_queue_name(queue) == queue_name:
                channel.basic_cancel(tag)

    @property
    def _event_loop(self) -> Hub:
        # Only the asynchronous receive path uses it, and kombu takes that path only
        # when the channel has an event loop.
        return cast(Hub, self._channel.hub)

    def shutdown_release_delay(self, queue_url: str) -> int:
        """Seconds a message released at shutdown waits: see :class:`ReceiveGate`."""
        return self._gate.release_delay(queue_url, int(self._channel.wait_time_seconds))

    def close(self) -> None:
        """Forget the queues parked for prefetch room: none may be woken once closed."""
        self._prefetch_room.forget()


def receive_size(queue_name: str, wanted: int) -> int:
    """How many messages one ReceiveMessage asks for.

    SQS answers with several messages of one FIFO group at once, and Celery would run them
    side by side in its pool. One at a time, SQS's group lock keeps the order: the next
    message of a group comes only after the one before it is deleted or released.
    """
    return 1 if is_fifo(queue_name) else wanted


def _raise(error: BaseException) -> None:
    raise error
