"""Where a lease's renewals go: one target per queue and process, on the live channel's client.

A lease outlives the channel that received its message: after a reconnect, the task keeps
running and its lease keeps being renewed, while the channel that received it is closed.
The client a renewal uses must then be the live connection's, not the closed channel's:
kombu replaces a channel's client when an STS session token is about to expire, and a
closed channel's client renews with expired credentials, which SQS refuses until the
lease runs out and the task runs twice. So every receive points its queue's target at
the channel that made it (:meth:`LeaseQueues.of`), and a renewal asks for the client of
the newest channel still open; only when none is open does it use the last one it had.
"""

from __future__ import annotations

import threading
import weakref
from functools import partial
from typing import Any

from botocore.client import BaseClient

from ..aws.clients import DerivedClients
from ..aws.sqs_queue import SQSQueue
from ..payloads.cleanup import ObjectCleanup

__all__ = ["LeaseQueues"]


class _LiveClient:
    """The SQS client of the newest channel receiving from one queue, while it is open."""

    def __init__(self, queue_name: str, channel: Any) -> None:
        self.queue_name = queue_name
        self._channel: weakref.ref[Any] = weakref.ref(channel)
        #: The last client had from an open channel: a closed channel's tasks still ack.
        self._last: BaseClient = channel.sqs(queue=queue_name)

    def follow(self, channel: Any) -> None:
        if self._channel() is not channel:
            self._channel = weakref.ref(channel)
            self._last = channel.sqs(queue=self.queue_name)

    def __call__(self) -> BaseClient:
        # Asked again on every call: kombu replaces the client when a token expires.
        channel = self._channel()
        if channel is not None and not channel.closed and channel.connection is not None:
            self._last = channel.sqs(queue=self.queue_name)
        return self._last


class LeaseQueues:
    """The renewal target of every queue the process receives from, by URL.

    Renewals go through ``clients``' renewal client of the live channel's; the S3
    objects of messages surely deleted go to ``cleanup``.
    """

    def __init__(self, clients: DerivedClients, cleanup: ObjectCleanup) -> None:
        self._clients = clients
        self._cleanup = cleanup
        self._queues: dict[str, tuple[SQSQueue, _LiveClient]] = {}
        self._lock = threading.Lock()

    def of(self, queue_name: str, queue_url: str, channel: Any) -> SQSQueue:
        """The target of ``queue_url``, from now on through ``channel``'s client."""
        with self._lock:
            known = self._queues.get(queue_url)
            if known is None:
                live = _LiveClient(queue_name, channel)
                target = SQSQueue(
                    queue_name,
                    queue_url,
                    lambda: self._clients.renewal(live()),
                    partial(self._cleanup.deleted, live),
                )
                known = self._queues[queue_url] = (target, live)
            else:
                known[1].follow(channel)
        return known[0]
