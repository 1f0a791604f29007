"""A channel's sender: its publishes go in batches inside a batch-publishing scope.

kombu's ``_put`` builds each message's SendMessage (queue URL, body, attributes, FIFO
group and deduplication ids, delay) differently from one kombu version to the next, and
then calls ``send_message`` on the queue's client (a predefined queue's own, with its
STS role). Inside a scope (:func:`~celery_sqs_heartbeat.publishing.scope.publishing_in_batches`)
kombu's ``_put`` runs as ever, but the client it is handed catches that one call: its
parameters, less the queue URL, become the message's SendMessageBatch entry, and the
client and URL its target. A body too large for SQS goes to S3 first, as a SendMessage's
would (:meth:`~celery_sqs_heartbeat.payloads.store.PayloadStore.offload`), so the entry
is sized as SQS will count it, against its queue's ``MaximumMessageSize``
(:meth:`~celery_sqs_heartbeat.aws.sqs_send.MessageLimits.of`), and the entry carries
the object put, which goes if SQS does not take the message. Outside a scope of the
publishing thread's own nothing changes. The channel's ``_put`` and ``sqs`` call in here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

from botocore.client import BaseClient

from ..aws.sqs_facts import is_fifo
from ..monitoring.pidbox_names import is_reply_queue
from ..payloads.pointers import message_size
from ..payloads.store import PayloadStore
from ..process import this_process
from .book import Unsent
from .publisher import SendTarget
from .scope import active_publisher

__all__ = ["Sender"]

#: Per thread: the SendMessage calls caught while this thread's ``_put`` runs.
_catching = threading.local()


class _SendCatcher:
    """The queue's client, but a ``send_message`` is noted instead of made.

    Everything else (kombu's queue lookups and creation on the way) goes to the client.
    """

    def __init__(self, client: BaseClient, caught: list[tuple[BaseClient, dict[str, Any]]]):
        self._client = client
        self._caught = caught

    def send_message(self, **params: Any) -> None:
        self._caught.append((self._client, params))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class Sender:
    """Hands a put's message to the batch publisher while its thread has a scope open."""

    def __init__(self, store: PayloadStore, canonical_queue_name: Callable[[str], str]) -> None:
        self._store = store
        self._canonical_queue_name = canonical_queue_name

    def put(self, queue: str, message: dict[str, Any], kombu_put: Callable[[], None]) -> None:
        """``kombu_put()``, its one SendMessage caught for a batch inside a scope.

        A redelivery (kombu's restore) is a ChangeMessageVisibility, made at once. A
        remote-control reply is never a scope's: it is the worker's answer, not the
        task's publish, and a reply to a reply queue that is gone must be dropped where
        it is sent (:class:`~celery_sqs_heartbeat.monitoring.reply_queue_keeper.ReplyQueueKeeper`),
        not fail the scope of whichever thread answered.
        """
        publisher = active_publisher()
        if publisher is None or message.get("redelivered") or is_reply_queue(queue):
            kombu_put()
            return
        caught: list[tuple[BaseClient, dict[str, Any]]] = []
        _catching.sends = caught
        try:
            kombu_put()
        finally:
            _catching.sends = None
        for client, params in caught:
            publisher.publish(self.unsent(queue, message, client, params))

    @staticmethod
    def catching(client: BaseClient) -> BaseClient:
        """``client``, catching its SendMessage while this thread's put runs in a scope."""
        caught = getattr(_catching, "sends", None)
        if caught is None:
            return client
        return cast(BaseClient, _SendCatcher(client, caught))

    def unsent(
        self, queue: str, message: dict[str, Any], client: BaseClient, params: dict[str, Any]
    ) -> Unsent:
        """The caught SendMessage as a batch entry, its body in S3 first if too large."""
        entry = dict(params)
        queue_url = entry.pop("QueueUrl")
        put = self._store.offload(client, entry, queue_url=queue_url)
        fifo = is_fifo(self._canonical_queue_name(queue))
        return Unsent(
            task_id=_task_id(message),
            target=SendTarget(client, queue_url),
            entry=entry,
            size=message_size(entry["MessageBody"], entry.get("MessageAttributes")),
            group=entry.get("MessageGroupId") if fifo else None,
            queue=queue_url,
            call_limit=this_process().message_limits.of(
                this_process().clients.publish(client), queue_url
            ),
            put_object=put,
        )


def _task_id(message: dict[str, Any]) -> str:
    """Celery's task id (protocol 2 header, or the correlation id); kombu's own messages
    have neither, and are named by their delivery tag."""
    headers = message.get("headers") or {}
    properties = message.get("properties") or {}
    return str(
        headers.get("id") or properties.get("correlation_id") or properties.get("delivery_tag")
    )
