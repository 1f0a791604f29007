"""Where kombu 5.5, 5.6 and 5.7 differ under the transport, and only here.

The transport overrides kombu's SQS channel at the points where a message is received,
acked and rejected; those points moved between releases. This module gives the
transport one shape of them on every supported kombu, detected by what kombu has, not
by its version number, so a backport in a patch release is picked up as it is.

What differs, and what the transport does about it (``docs/compatibility.md`` has the
table of every overridden method):

- kombu 5.7 made the transport a package, with its exceptions in a module of their own.
- kombu 5.5's blocking receive (solo without an event loop, gevent, eventlet) calls
  boto3 inline; 5.6 added ``Channel._receive_message``, where the transport takes the
  lease, handles errors and asks for the receive count. :class:`SQSChannel` gives 5.5
  that method, and a blocking receive that goes through it.
- ``QoS.is_backoff_task`` exists from 5.7 only: :func:`is_backoff_task` answers the same
  question from what every release has.
- kombu 5.7 broadcasts (``supports_fanout``) through SNS; before it, a broadcast on SQS
  reached no worker, so ``celery inspect`` and ``celery control`` cannot work there.
  :data:`KOMBU_BROADCASTS_THROUGH_SNS` tells the transport whether to declare fanout.
- kombu 5.5's asynchronous HTTP client (urllib3's) makes each request inline, on the
  event loop: a long poll holds the worker's loop for up to ``wait_time_seconds``, 10 s by
  default, and nothing else runs meanwhile. In a prefork worker that loop also hands
  received tasks to the pool and reads their results, so a task started up to one long
  poll after it was received, and its ack or reject (a failed task's release) came up to
  one long poll after it ended; with room in the prefetch window, the loop is in a long
  poll almost all the time. kombu 5.6 and later wait for the answer on the loop (pycurl).
  :meth:`SQSChannel._send_long_poll` makes 5.5's receive on a thread of its own, which
  hands the answer back to the loop and wakes it (:class:`LoopWaker`).
- kombu 5.5 deletes a message of a no-ack queue (a mailbox) with its asynchronous
  client, inline in ``_message_to_python``; later releases call ``Channel._delete_message``
  there, where the transport sends that delete through its outbox (retried, off the loop).
  :class:`SQSChannel` gives 5.5 a ``_message_to_python`` that deletes through it.
- kombu 5.7 deletes a message rejected without requeue (``_delete_rejected_message``,
  unless the queue has a dead-letter queue); 5.5 and 5.6 leave it to come back when its
  visibility timeout ends. The transport keeps each release's own behaviour: its
  override of that method is simply never called before 5.7.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping
from contextlib import suppress
from importlib.util import find_spec
from queue import Empty
from typing import Any, ClassVar, cast

from kombu.asynchronous import Hub
from kombu.asynchronous.aws.sqs.message import AsyncMessage
from kombu.transport import SQS
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from .aws.sqs_facts import RECEIVE_COUNT_ATTRIBUTE
from .process import this_process

try:
    from kombu.transport.SQS.exceptions import (
        DoesNotExistQueueException,
        UndefinedQueueException,
    )
except ImportError:  # kombu 5.5 and 5.6: the transport is one module
    from kombu.transport.SQS import (  # type: ignore[attr-defined]
        DoesNotExistQueueException,
        UndefinedQueueException,
    )

__all__ = [
    "KOMBU_BROADCASTS_THROUGH_SNS",
    "KOMBU_RECEIVES_ON_THE_LOOP",
    "DoesNotExistQueueException",
    "LoopWaker",
    "SQSChannel",
    "UndefinedQueueException",
    "backoff_policy_of",
    "call_soon_waking",
    "cancel_timers_of_closed_http_clients",
    "is_backoff_task",
]

#: kombu 5.6 and later receive through one method on both paths.
KOMBU_HAS_RECEIVE_METHOD = hasattr(SQS.Channel, "_receive_message")

#: Later kombu than 5.5 deletes a no-ack message through ``Channel._delete_message``.
KOMBU_HAS_DELETE_METHOD = hasattr(SQS.Channel, "_delete_message")

#: kombu 5.7 and later turn a fanout exchange into an SNS topic with the queues subscribed.
KOMBU_BROADCASTS_THROUGH_SNS = hasattr(SQS.Channel, "_put_fanout")

#: kombu 5.6 and later wait for an SQS answer on the event loop (pycurl's client); kombu
#: 5.5 has only urllib3's, which makes the request inline and holds the loop meanwhile.
KOMBU_RECEIVES_ON_THE_LOOP = find_spec("kombu.asynchronous.http.curl") is not None

#: What kombu's asynchronous client asks for when the user did not say.
_DEFAULT_ATTRIBUTES = [RECEIVE_COUNT_ATTRIBUTE]


class SQSChannel(SQS.Channel):
    """kombu's SQS channel, with the receive paths of kombu 5.6 and later on 5.5 too."""

    def _send_long_poll(
        self,
        queue_name: str,
        queue_url: str,
        connection: Any,
        count: int,
        wait_time_seconds: int,
        answered: Any,
    ) -> None:
        """The worker's asynchronous ReceiveMessage; the loop gets the answer in ``answered``.

        ``answered`` (a promise) is called with SQS's answer, or thrown the error, on the
        event loop. ``wait_time_seconds`` 0 asks without waiting (kombu's client sends a
        0 as it is).
        """
        if KOMBU_RECEIVES_ON_THE_LOOP:
            connection.receive_message(
                queue_name,
                queue_url,
                number_messages=count,
                visibility_timeout=self.visibility_timeout,
                wait_time_seconds=wait_time_seconds,
                callback=answered,
            )
            return
        request = {
            "QueueUrl": queue_url,
            "MaxNumberOfMessages": count,
            "VisibilityTimeout": self.visibility_timeout,
            "WaitTimeSeconds": wait_time_seconds,
        }
        # What kombu's asynchronous client asks for: ApproximateReceiveCount unless told.
        if connection.fetch_message_attributes:
            request["AttributeNames"] = list(connection.fetch_message_attributes)
        self._receive_on_a_thread(queue_name, request, answered)

    def _receive_on_a_thread(self, queue_name: str, request: dict[str, Any], answered: Any) -> None:
        """kombu 5.5: the receive its client would make on the loop, on a thread of its own.

        One attempt, as kombu's client makes
        (:meth:`~celery_sqs_heartbeat.aws.clients.DerivedClients.receive`); the answer, or the
        error, is handed to the loop, which is woken for it.
        """
        client = this_process().clients.receive(self.sqs(queue=queue_name))
        waker = LoopWaker.of(cast(Hub, self.hub))

        def on_the_loop(deliver: Callable[..., Any], outcome: Any) -> None:
            # A channel closed meanwhile has no consumer left to take the messages: SQS
            # shows them again when their visibility timeout ends, as it does the answer
            # of a poll still pending at the close on kombu 5.6 and later.
            if not self.closed:
                deliver(outcome)

        def receive() -> None:
            try:
                answer = client.receive_message(**request)
            except Exception as exc:
                waker.call_soon(on_the_loop, answered.throw, exc)
            else:
                waker.call_soon(on_the_loop, answered, answer)

        thread = threading.Thread(target=receive, name="celery-sqs-heartbeat-receive", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no new thread at interpreter shutdown: kombu 5.5's own way
            receive()

    if not KOMBU_HAS_RECEIVE_METHOD:

        def _receive_message(
            self,
            queue: str,
            max_number_of_messages: int = 1,
            wait_time_seconds: int | None = None,
        ) -> Any:
            """One blocking ReceiveMessage, asking for the attributes the async path gets.

            The receive count drives ``release_delay``; kombu 5.5 asked for it only on
            its asynchronous path.
            """
            attributes = self.fetch_message_attributes or _DEFAULT_ATTRIBUTES
            return self.sqs(queue=queue).receive_message(
                QueueUrl=self._new_queue(queue),
                MaxNumberOfMessages=max_number_of_messages,
                WaitTimeSeconds=wait_time_seconds or self.wait_time_seconds,
                AttributeNames=list(attributes),
            )

        def _get_bulk(self, queue: str, *args: Any, **kwargs: Any) -> None:
            """kombu 5.5's blocking receive, sent through :meth:`_receive_message`."""
            max_count = self._get_message_estimate()
            if not max_count:
                raise Empty()
            response = self._receive_message(
                queue,
                max_number_of_messages=max_count,
                wait_time_seconds=self.wait_time_seconds,
            )
            messages = response.get("Messages")
            if not messages:
                raise Empty()
            for message in messages:
                message["Body"] = AsyncMessage(body=message["Body"]).decode()
            for payload in self._messages_to_python(messages, queue):
                self.connection._deliver(payload, queue)

    if not KOMBU_HAS_DELETE_METHOD:

        def _message_to_python(self, message: dict[str, Any], queue_name: str, q_url: str) -> Any:
            """kombu 5.5's decode, its no-ack delete made through ``_delete_message``.

            kombu 5.5 calls its asynchronous client here itself, where the transport
            cannot take the delete over.
            """
            if queue_name not in self._noack_queues:
                return super()._message_to_python(message, queue_name, q_url)
            payload = loads(bytes_to_str(self._optional_b64_decode(message["Body"].encode())))
            self._delete_message(queue_name, message)
            return payload


def is_backoff_task(qos: Any, delivery_tag: str) -> bool:
    """Whether a predefined queue's ``backoff_policy`` retries this delivery's task."""
    return backoff_policy_of(qos, delivery_tag) is not None


def backoff_policy_of(qos: Any, delivery_tag: str) -> Mapping[int, int] | None:
    """The ``backoff_policy`` (receive count to seconds) that retries this delivery's task.

    None unless a predefined queue gives one for the task (``backoff_tasks``). kombu
    would set the visibility itself when the message is rejected, synchronously and by
    the delivery's first receipt handle; the transport sends it through the manager
    instead.
    """
    routing_key, message, backoff_tasks, backoff_policy = (
        qos._extract_backoff_policy_configuration_and_message(delivery_tag)
    )
    if not (routing_key and message and backoff_tasks and backoff_policy):
        return None
    if (message.headers or {}).get("task") not in backoff_tasks:
        return None
    return cast(Mapping[int, int], backoff_policy)


def call_soon_waking(hub: Hub, callback: Callable[..., Any], *args: Any) -> None:
    """``hub.call_soon`` from any thread, waking the loop if it watches a :class:`LoopWaker`.

    On kombu 5.5 a loop watches one from its first receive on, and then polls its file
    descriptors until the next timer instead of napping 0.1 s at a time (threads pool):
    a call from a pool thread would wait for that timer, up to seconds.
    """
    waker = LoopWaker._by_loop.get(hub)
    if waker is None:
        hub.call_soon(callback, *args)
    else:
        waker.call_soon(callback, *args)


class LoopWaker:
    """Hands a call from another thread to kombu's event loop, and wakes the loop for it.

    ``Hub.call_soon`` is safe from any thread, but the loop may sleep in its poll for
    seconds, until its next timer; a byte written to a pipe the loop watches ends the
    poll at once. One waker per loop, for the life of the process.
    """

    _by_loop: ClassVar[weakref.WeakKeyDictionary[Hub, LoopWaker]] = weakref.WeakKeyDictionary()

    def __init__(self, hub: Hub) -> None:
        self._hub = weakref.ref(hub)
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        # Closed when no thread can write any more: a thread that still might keeps the
        # waker alive, so a later file never gets this descriptor number under its feet.
        weakref.finalize(self, _close, self._read, self._write)

    @classmethod
    def of(cls, hub: Hub) -> LoopWaker:
        """The loop's waker, watched by the loop; from the loop's own thread only."""
        waker = cls._by_loop.get(hub)
        if waker is None:
            waker = cls._by_loop[hub] = cls(hub)
        # A loop that restarts (Celery's consumer reconnecting) forgets what it watched.
        if waker._read not in hub.readers:
            hub.add_reader(waker._read, waker._drain)
        return waker

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run ``callback(*args)`` on the loop's next turn; from any thread."""
        hub = self._hub()
        if hub is None:
            return
        hub.call_soon(callback, *args)
        # A full pipe means the loop has a wake-up waiting already.
        with suppress(BlockingIOError):
            os.write(self._write, b"\0")

    def _drain(self) -> None:
        with suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def cancel_timers_of_closed_http_clients(hub: Hub) -> int:
    """Cancel the timeout checks kombu's curl client left on ``hub`` at its close (5.7).

    pycurl asks the client for one-shot checks (``hub.call_later``) while a request is
    out; its close cancels only its repeating one. Celery resets the hub at every
    reconnect, which in kombu 5.7 closes the client (5.6 keeps it open), and each check
    left then fires on the closed client and logs "Error in timer" with a traceback
    (pycurl: "cannot invoke info_read() - no multi handle"). A closed client has nothing
    left to check.
    Returns how many were cancelled.
    """
    cancelled = 0
    for scheduled in hub.timer.queue:
        entry = scheduled.entry
        client = getattr(entry.fun, "__self__", None)
        if _is_closed_curl_client(client) and not entry.canceled:
            entry.cancel()
            cancelled += 1
    return cancelled


def _is_closed_curl_client(client: Any) -> bool:
    if not KOMBU_RECEIVES_ON_THE_LOOP:
        return False
    from kombu.asynchronous.http.curl import CurlClient

    return isinstance(client, CurlClient) and getattr(client, "_closed", False) is True
