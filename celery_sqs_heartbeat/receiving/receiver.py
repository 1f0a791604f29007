"""The receive loop of a channel, made to survive SQS, to receive as soon as there is
room, and to keep several receives in flight on a queue with a backlog.

Where kombu's loop stops for good when a receive raises (kombu 5.7 ends the worker when
SQS answers with an error), a failed turn here only delays the next one: a failed
ReceiveMessage is retried with backoff (:mod:`celery_sqs_heartbeat.receiving.failures`), except
for errors no retry can fix, which stop the worker with the queue and the cause named.

Where kombu looks again only ``polling_interval`` after the prefetch window filled, the
loop here parks a queue until an ack frees room for a full call
(:mod:`celery_sqs_heartbeat.receiving.prefetch`), and then receives at once. Where kombu
keeps one receive on the wire per queue, a queue whose answers come back full runs
several chains of receives side by side (:mod:`celery_sqs_heartbeat.receiving.chains`).

Every receive asks SQS for the channel's ``visibility_timeout`` as its lease, whatever
the queue's attribute says. Beyond that, this part knows nothing of leases: the
channel's :class:`~celery_sqs_heartbeat.receiving.intake.Intake` takes a lease for what
the receives bring. The channel calls in here from its kombu hooks, handing over kombu's
own step where this part goes around it; the blocking path (gevent, eventlet) is
:attr:`Receiver.blocking`, sharing the gate, the chains and the prefetch room.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol, cast

from botocore.client import BaseClient
from kombu.asynchronous import Hub
from vine import promise

from ..compat import call_soon_waking
from .blocking import BlockingReceiver
from .chains import FAILED, ReceiveChains, receive_size
from .failures import ReceiveFailures
from .gate import ReceiveGate
from .prefetch import PrefetchRoom, full_call_room
from .redelivery import mark_redelivered
from .retries import NO_ANSWER, classify_receive_error
from .rounds import asks_without_wait

__all__ = ["Receiver", "ReceivingPort"]


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
        self,
        queue_name: str,
        queue_url: str,
        connection: Any,
        count: int,
        wait_time_seconds: int,
        answered: Any,
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
        receives_in_flight: int,
    ) -> None:
        self._channel = channel
        self._kombu_turn = kombu_turn
        self._polling_interval = polling_interval
        self._gate = ReceiveGate(clock)
        self.chains = ReceiveChains(
            lambda: channel.qos.can_consume_max_estimate(),
            self._full_call,
            lambda: channel.qos.prefetch_count or 0,
            receives_in_flight,
        )
        #: While an answer of the event loop's receive is being handed over: that receive.
        self._answer_in_hand: _Answer | None = None
        # The room left beside the queue's receives on the wire: they hold theirs until
        # answered.
        self._prefetch_room = PrefetchRoom(
            self._free_room, self._room_worth_a_receive, polling_interval
        )
        self._failures = ReceiveFailures(channel, self._gate)
        self.blocking = BlockingReceiver(
            channel, self._gate, self.chains, self._prefetch_room, self._failures
        )

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
        if asks_without_wait():
            params["WaitTimeSeconds"] = 0

    @staticmethod
    def marked_redelivered(payload: Any, message: dict[str, Any]) -> Any:
        """kombu's decoded message, marked redelivered when SQS delivered it before."""
        return mark_redelivered(payload, message)

    @property
    def answer_sent_at(self) -> float | None:
        """While an answer of the event loop is handed over: when its ReceiveMessage was
        sent. SQS started the messages' leases at some point since."""
        answer = self._answer_in_hand
        return None if answer is None else answer.sent_at

    def schedule_queue(self, queue: str) -> None:
        """A turn of one of the queue's receive chains: wait out a failing queue's backoff.

        kombu's loop stops for good when a receive raises, and kombu 5.7 ends the worker
        when SQS answers with an error; here a failed turn only delays the next one. Of
        a queue's chains (:mod:`~celery_sqs_heartbeat.receiving.chains`), one waits out
        a backoff and the others end; each waits for room of its own.
        """
        name = self._channel.canonical_queue_name(queue)
        if queue not in self._channel._active_queues:
            self.chains.end(name)
            self._kombu_turn(queue)  # which ends kombu's loop on the queue
            return
        self.chains.turn(name)
        wait = self._gate.wait(name)
        if wait > 0:
            if not self.chains.may_end(name):
                self._event_loop.call_later(wait, self.schedule_queue, queue)
            return
        if not self._parked(queue):
            self._receive_now(queue)

    def _parked(self, queue: str, slots: int | None = None) -> bool:
        """Whether the chain waits for room (a full call's, or ``slots``) instead of receiving.

        Woken by :meth:`prefetch_room_freed`; kombu's own wait is the longest it waits.
        """
        parked = self._prefetch_room.park(queue, slots)
        if parked is None:
            return False
        self._event_loop.call_later(
            self._polling_interval(), self._settle_for_any_room, queue, parked
        )
        return True

    def _receive_now(self, queue: str) -> None:
        """kombu's turn: a receive, unless the receives on the wire hold all the room left.

        An ack woke this chain for room that another chain woken with it may have taken.
        """
        if self._parked(queue, 1):
            return
        try:
            self._kombu_turn(queue)
        except Exception as exc:
            # Before anything was sent: the queue's URL or the client could not be had.
            name = self._channel.canonical_queue_name(queue)
            self._failures.failed(name, classify_receive_error(exc))
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

    def _free_room(self, queue: str | None) -> int | None:
        if queue is None:
            return cast(int | None, self._channel.qos.can_consume_max_estimate())
        return self.chains.free_room(self._channel.canonical_queue_name(queue))

    def _full_call(self, queue_name: str) -> int:
        """A full call's room on a queue: FIFO queues receive one at a time."""
        return receive_size(queue_name, full_call_room(self._channel.qos.prefetch_count))

    def _room_worth_a_receive(self, queue: str | None) -> int:
        channel = self._channel
        names = [queue] if queue is not None else list(channel._active_queues)
        return min(
            (self._full_call(channel.canonical_queue_name(q)) for q in names),
            default=full_call_room(channel.qos.prefetch_count),
        )

    def get_from_sqs(
        self, queue_name: str, queue_url: str, connection: Any, count: int, callback: Any
    ) -> Any:
        """Send a chain's receive; whatever comes back keeps the loop going.

        Sized to the room the window has beside the receives on the wire, and a long poll
        only when no other receive of the queue is out.
        """
        receive = self.chains.sending(queue_name, receive_size(queue_name, count))
        wait = int(self._channel.wait_time_seconds) if receive.long_poll else 0
        token = self._gate.poll_sent(queue_url, wait)
        sent = _Answer(queue_name, token, receive.size)
        answered = promise(
            self._on_receive_answer, (sent, callback), on_error=self._on_receive_error
        )
        try:
            self._channel._send_long_poll(
                queue_name, queue_url, connection, receive.size, wait, answered
            )
        except BaseException:
            self._gate.poll_answered(token)
            self.chains.answered(queue_name, receive.size)
            raise
        return answered

    def _on_receive_answer(self, sent: _Answer, callback: Any, answer: Any) -> None:
        sent_at = self._gate.poll_answered(sent.token)
        self.chains.answered(sent.queue_name, sent.asked)
        if self._channel.closed:
            # Closed while the poll was out (see _next_turn): nobody takes the messages,
            # and SQS shows them again when their visibility timeout ends.
            return
        if isinstance(answer, dict):
            self._gate.succeeded(sent.queue_name, sent_at)
            returned = len(answer.get("Messages") or [])
        else:
            # kombu's client turns a 5xx, a timeout or a dropped connection into a list.
            self._failures.failed(sent.queue_name, NO_ANSWER)
            answer, returned = {}, FAILED
        # Delivered now, as kombu does: deferred to the next turn of the hub, a threads
        # pool's hub (no file descriptor to wait on) would first sleep up to 0.1 s, on
        # every receive. An error while delivering is kombu's or Celery's, not the
        # receive's: it is raised again from the hub, outside this promise, whose
        # on_error would take it for a failed receive.
        try:
            self._hand_over(sent.answered(sent_at, returned), callback, answer)
        except Exception as exc:
            self._event_loop.call_soon(partial(_raise, exc))

    def _hand_over(self, answer: _Answer, callback: Any, messages: Any) -> None:
        """kombu's delivery of an answer, which ends in its next turn (:meth:`next_turn`).

        Then the room the receive held and did not fill is free: a chain of the queue
        parked for it is woken, or it would wait for an ack (kombu's wait is over by now,
        and the chain waits for any room, which only an ack announces).
        """
        self._answer_in_hand = answer
        try:
            callback(messages)
        finally:
            self._answer_in_hand = None
            if answer.returned < answer.asked:
                self.prefetch_room_freed()

    def _on_receive_error(self, sent: _Answer, callback: Any, error: BaseException) -> None:
        self._gate.poll_answered(sent.token)
        self.chains.answered(sent.queue_name, sent.asked)
        self._failures.failed(sent.queue_name, classify_receive_error(error))
        # An empty answer lets kombu schedule the next turn, which waits out the backoff.
        self._event_loop.call_soon(partial(self._next_turn, sent.answered(None, FAILED), callback))

    def _next_turn(self, failed: _Answer, callback: Any) -> None:
        """kombu's next turn after a failed receive, unless the channel closed meanwhile.

        A client's channel on the worker's loop (a task that pings the workers, in a
        threads pool) is closed by the client when it has its answers, while its poll is
        out; kombu's next turn reads the closed channel's connection, and that error
        ended the worker.
        """
        if not self._channel.closed:
            self._hand_over(failed, callback, {})

    def next_turn(self, queue: str, kombu_next_turn: Callable[[], None]) -> None:
        """After an answer is delivered (kombu's ``_loop1``): its chain goes on, or ends,
        and a full answer may start another chain beside it."""
        answer = self._answer_in_hand
        if answer is None:
            # A turn that received nothing (kombu's own, on a full window): kombu's pace.
            kombu_next_turn()
            return
        goes_on, another = self.chains.after_answer(
            answer.queue_name, answer.asked, answer.returned
        )
        if goes_on:
            kombu_next_turn()
        if another:
            self._event_loop.call_soon(self.schedule_queue, queue)

    @property
    def _event_loop(self) -> Hub:
        # Only the asynchronous receive path uses it, and kombu takes that path only
        # when the channel has an event loop.
        return cast(Hub, self._channel.hub)

    def shutdown_release_delay(self, queue_url: str) -> int:
        """Seconds a message released at shutdown waits: see :class:`ReceiveGate`."""
        return self._gate.release_delay(queue_url)

    def close(self) -> None:
        """Forget the queues parked for prefetch room: none may be woken once closed."""
        self._prefetch_room.forget()


@dataclass(frozen=True)
class _Answer:
    """One receive of the event loop, from its send to its next turn."""

    queue_name: str
    token: int
    asked: int
    sent_at: float | None = None
    #: Messages SQS returned; :data:`FAILED` for a failed receive.
    returned: int = 0

    def answered(self, sent_at: float | None, returned: int) -> _Answer:
        return replace(self, sent_at=sent_at, returned=returned)


def _raise(error: BaseException) -> None:
    raise error
