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

import os
import threading
import weakref
from typing import Any

from botocore.client import BaseClient

from ..aws.sqs_queue import SQSQueue

__all__ = ["LeaseQueues", "lease_queues"]


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
    """The renewal target of every queue the process receives from, by URL."""

    def __init__(self) -> None:
        self._queues: dict[str, tuple[SQSQueue, _LiveClient]] = {}
        self._lock = threading.Lock()

    def of(self, queue_name: str, queue_url: str, channel: Any) -> SQSQueue:
        """The target of ``queue_url``, from now on through ``channel``'s client."""
        with self._lock:
            known = self._queues.get(queue_url)
            if known is None:
                client = _LiveClient(queue_name, channel)
                known = self._queues[queue_url] = (SQSQueue(queue_name, queue_url, client), client)
            else:
                known[1].follow(channel)
        return known[0]


_shared = LeaseQueues()


def lease_queues() -> LeaseQueues:
    """The process's targets, shared by every connection (a reconnect makes a new one)."""
    return _shared


def _forget_at_fork() -> None:
    """A forked pool child renews nothing of its parent's, and must not share its lock."""
    global _shared
    _shared = LeaseQueues()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_at_fork)
