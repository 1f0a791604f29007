"""The blocking receive path (gevent, eventlet, plain kombu), made to wait on acks and
to receive side by side.

Without an event loop, kombu receives in ``drain_events``: ``_get_bulk`` makes one
ReceiveMessage and delivers what it brings. Here the drain waits for prefetch room
instead of kombu's ``polling_interval``, a failed receive reads as an empty one (and
backs off), and on a backlog ``_get_bulk``'s receive becomes a round of calls side by
side (:mod:`~celery_sqs_heartbeat.receiving.rounds`). The channel calls in here from its
kombu hooks, handing over kombu's own step where this part goes around it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from queue import Empty
from typing import Any, Protocol

from botocore.client import BaseClient
from botocore.exceptions import BotoCoreError, ClientError
from celery.utils.log import get_logger

from .chains import FAILED, Receive, ReceiveChains, receive_size
from .failures import ReceiveFailures
from .gate import ReceiveGate
from .prefetch import PrefetchRoom
from .retries import classify_receive_error
from .rounds import ReceiveRounds

__all__ = ["FULL_WINDOW_WAIT", "BlockingPort", "BlockingReceiver"]

logger = get_logger(__name__)

#: The longest the blocking receive loop waits in one call for the window to free up.
FULL_WINDOW_WAIT = 0.1

#: A receive as the intake takes it: the queue, and the call that brings the answer.
IntakeReceive = Callable[[str, Callable[[], Any]], Any]


class BlockingPort(Protocol):
    """What the blocking path reads of, and asks of, its kombu channel."""

    @property
    def hub(self) -> Any: ...

    @property
    def _consumers(self) -> set[str]: ...

    def canonical_queue_name(self, queue_name: str) -> str: ...

    def sqs(self, queue: str | None = None) -> BaseClient: ...

    def _new_queue(self, queue: str) -> str: ...


class BlockingReceiver:
    """One channel's blocking receives: the drain's wait, rounds, and failures read as empty."""

    def __init__(
        self,
        channel: BlockingPort,
        gate: ReceiveGate,
        chains: ReceiveChains,
        prefetch_room: PrefetchRoom,
        failures: ReceiveFailures,
    ) -> None:
        self._channel = channel
        self._gate = gate
        self._rounds = ReceiveRounds(chains)
        self._prefetch_room = prefetch_room
        self._failures = failures
        #: Whether the blocking receive path (kombu's ``_get_bulk``) is running.
        self.in_bulk = False

    def get_bulk(self, kombu_get_bulk: Callable[[], Any]) -> Any:
        """The blocking receive path (no event loop: gevent, eventlet, plain kombu)."""
        self.in_bulk = True
        try:
            return kombu_get_bulk()
        finally:
            self.in_bulk = False

    def delete_message(
        self, queue_name: str, message: dict[str, Any], outbox_delete: Callable[[], None]
    ) -> None:
        """Delete a no-ack message: blocking, unless it came on the event loop.

        On the loop, kombu's asynchronous delete raised a 5xx inside the loop, which
        ended the worker; it goes to the manager's outbox there (``outbox_delete``),
        retried until SQS confirms it. Elsewhere (gevent, a monitor, ``celery
        inspect``) it is one blocking call, as cheap as kombu's; one that fails goes to
        the outbox too, logged, instead of raising out of the receive. A blocking
        receive may run outside the loop's thread: a task that pings the workers, in a
        threads pool, on a channel that took the worker's loop when it was made. The
        loop's HTTP client belongs to the loop's thread (``pycurl.error: cannot
        add/remove handle - multi_perform() already running`` from any other).
        """
        if self._channel.hub is not None and not self.in_bulk:
            outbox_delete()
            return
        try:
            self._channel.sqs(queue=queue_name).delete_message(
                QueueUrl=self._channel._new_queue(queue_name),
                ReceiptHandle=message["ReceiptHandle"],
            )
        except (ClientError, BotoCoreError) as exc:
            logger.warning(
                "Deleting a message of queue %s failed (%r): retrying it while it is hidden",
                queue_name,
                exc,
            )
            outbox_delete()

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

    def receive_round(
        self,
        queue: str,
        kwargs: dict[str, Any],
        kombu_receive: Callable[..., Any],
        intake_receive: Callable[[str, Callable[[], Any]], Any],
    ) -> Any:
        """The blocking receive: one call, or a round of them side by side on a backlog.

        Only kombu's ``_get_bulk`` makes rounds (:mod:`~celery_sqs_heartbeat.receiving.rounds`);
        its other receives (``basic_get``, a reply queue's) are one call. Each call is
        kombu's receive inside this receiver's failure handling, inside the intake's
        steps.
        """

        def one_receive(receive: Receive) -> tuple[Any, int]:
            returned = [FAILED]

            def counted(queue: str, **call: Any) -> Any:
                response = kombu_receive(queue, **call)
                returned[0] = len(response.get("Messages") or [])
                return response

            call = {**kwargs, "max_number_of_messages": receive.size}
            response = intake_receive(queue, partial(self.receive_message, queue, call, counted))
            return response, returned[0]

        wanted = kwargs.get("max_number_of_messages")
        if not self.in_bulk or wanted is None:
            alone = partial(self.receive_message, queue, kwargs, kombu_receive)
            return intake_receive(queue, alone)
        name = self._channel.canonical_queue_name(queue)
        return self._rounds.receive(name, receive_size(name, wanted), one_receive)

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
        sent_at = self._gate.now()
        try:
            response = kombu_receive(queue, **kwargs)
        except Exception as exc:
            self._failures.failed(queue_name, classify_receive_error(exc))
            raise Empty() from None
        self._gate.succeeded(queue_name, sent_at)
        return response
