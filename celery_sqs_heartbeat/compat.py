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
- kombu 5.7 deletes a message rejected without requeue (``_delete_rejected_message``,
  unless the queue has a dead-letter queue); 5.5 and 5.6 leave it to come back when its
  visibility timeout ends. The transport keeps each release's own behaviour: its
  override of that method is simply never called before 5.7.
"""

from __future__ import annotations

from queue import Empty
from typing import Any

from kombu.asynchronous.aws.sqs.message import AsyncMessage
from kombu.transport import SQS

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
    "DoesNotExistQueueException",
    "SQSChannel",
    "UndefinedQueueException",
    "is_backoff_task",
]

#: kombu 5.6 and later receive through one method on both paths.
KOMBU_HAS_RECEIVE_METHOD = hasattr(SQS.Channel, "_receive_message")

#: kombu 5.7 and later turn a fanout exchange into an SNS topic with the queues subscribed.
KOMBU_BROADCASTS_THROUGH_SNS = hasattr(SQS.Channel, "_put_fanout")

#: What kombu's asynchronous client asks for when the user did not say.
_DEFAULT_ATTRIBUTES = ["ApproximateReceiveCount"]


class SQSChannel(SQS.Channel):
    """kombu's SQS channel, with the receive path of kombu 5.6 and later on 5.5 too."""

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


def is_backoff_task(qos: Any, delivery_tag: str) -> bool:
    """Whether a predefined queue's ``backoff_policy`` retries this delivery's task.

    kombu then changes the message's visibility itself when it is rejected, so the
    transport must not release it too.
    """
    routing_key, message, backoff_tasks, backoff_policy = (
        qos._extract_backoff_policy_configuration_and_message(delivery_tag)
    )
    if not (routing_key and message and backoff_tasks and backoff_policy):
        return False
    return (message.headers or {}).get("task") in backoff_tasks
