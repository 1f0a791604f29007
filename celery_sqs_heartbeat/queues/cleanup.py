"""A monitor's event queue goes when its consumer leaves; a queue whose name comes back stays.

Monitors and remote control declare their queues ``auto_delete``: a broker deletes such a
queue when its last consumer leaves. SQS has no such thing, and kombu's SQS channel left
every one behind: each ``celery events`` or Flower start left a ``celeryev-<uuid>``
queue, subscribed to its SNS topic, that kept filling with events.

When the last consumer of this channel on an auto-delete queue is cancelled (``celery
events`` stops, the channel closes, the process exits: :mod:`.exit_cleanup`), the queue
is deleted, which also unsubscribes it from its SNS topic (kombu's ``queue_delete``),
only if it is provably this process's alone: an event receiver's queue, bound to
Celery's event exchange and named with the fresh UUID each receiver makes
(:func:`is_single_use`).

Any other is left as it is, subscribed, as kombu's stock transport leaves it: a worker's
mailbox (``<node>.celery.pidbox``), the RPC result backend's queue, an event queue named
by its receiver's ``node_id``, yours. Their names come back, and nothing tells a leaving
consumer whether another process consumes the same queue meanwhile: two workers of one
node name (a blue/green restart on one host) share one mailbox, and SNS's ``Subscribe``
hands both the same subscription. Unsubscribing it when the old worker stopped left the
new one's mailbox subscribed to nothing, and every ``inspect``, ``control`` and revoke
reached no one. Deleting it would also stop a worker restarted within the minute (SQS
refuses a name deleted less than 60 s before, ``QueueDeletedRecently``). A stopped
worker's mailbox thus keeps collecting broadcasts, at most its retention period's worth
(:mod:`.retention`), until a worker of that name reads them.

A remote-control reply queue, auto-delete too, is bound to no topic and not single use
by that rule: :mod:`~celery_sqs_heartbeat.monitoring.reply_queue_keeper` keeps it
between calls and deletes it itself.

A failure here is logged and never raised: the consumer is leaving anyway, and a queue
left behind is what happened before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from celery.events.event import EVENT_EXCHANGE_NAME
from celery.utils.log import get_logger

from ..process import this_process

__all__ = ["AutoDeletePort", "AutoDeleteQueues", "is_single_use"]

logger = get_logger(__name__)

#: An event receiver's queue name when Celery chose its node id: ``<prefix>.<uuid4>``.
_FRESH_UUID_NAME = re.compile(r".+[.-][0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_single_use(queue: str, bound_exchanges: Collection[str]) -> bool:
    """Whether ``queue``, bound to these exchanges, is never declared again once left.

    Celery's event receiver names its queue ``<prefix>.<node id>``, the node id a fresh
    UUID unless the caller passes one (then the name comes back in every process that
    does).
    """
    return EVENT_EXCHANGE_NAME in bound_exchanges and _FRESH_UUID_NAME.fullmatch(queue) is not None


class AutoDeletePort(Protocol):
    """What the auto-delete queues part reads of, and asks of, its kombu channel."""

    @property
    def _tag_to_queue(self) -> dict[str, str]: ...

    @property
    def predefined_queues(self) -> Mapping[str, Any]: ...

    @property
    def state(self) -> Any: ...

    def basic_cancel(self, consumer_tag: str) -> Any: ...

    def queue_delete(self, queue: str) -> Any: ...


class AutoDeleteQueues:
    """Deletes a single-use queue of its channel once its last consumer is cancelled."""

    def __init__(self, channel: AutoDeletePort) -> None:
        self._channel = channel
        #: Auto-delete queues this channel declared and has not removed yet.
        self._queues: set[str] = set()

    def declared(self, queue: str, auto_delete: bool, passive: bool) -> None:
        """A queue was declared: an auto-delete one is remembered, and left for the exit."""
        if auto_delete and not passive:
            self._queues.add(queue)
            this_process().leftovers.add_channel(self, os.getpid())

    def cancel(self, consumer_tag: str, kombu_cancel: Callable[[str], Any]) -> Any:
        """``kombu_cancel(consumer_tag)``, then the queue goes if it was its last consumer."""
        tag_to_queue = self._channel._tag_to_queue
        queue = tag_to_queue.get(consumer_tag)
        cancelled = kombu_cancel(consumer_tag)
        if queue is not None and self._removable(queue) and queue not in tag_to_queue.values():
            self._queues.discard(queue)
            self._delete_left_queue(queue)
        return cancelled

    def remove_queues_still_consumed(self) -> None:
        """At exit: the consumers of single-use queues never cancelled are, and their queues go.

        Cancelled first, as at any cancel: a thread still polling the queue (Flower's
        event capture) then no longer asks for it, instead of finding it gone and
        taking its absence for a misconfiguration. The consumers of other queues are
        left as they are: their queues stay anyway.
        """
        for tag, queue in list(self._channel._tag_to_queue.items()):
            if self._removable(queue):
                self._channel.basic_cancel(tag)

    def _removable(self, queue: str) -> bool:
        """Whether ``queue`` goes once this channel no longer consumes it."""
        if queue not in self._queues or self._channel.predefined_queues:
            return False
        exchanges = [binding.exchange for binding in self._channel.state.queue_bindings(queue)]
        return is_single_use(queue, exchanges)

    def _delete_left_queue(self, queue: str) -> None:
        try:
            # kombu's queue_delete unsubscribes it from each fanout topic it is bound to.
            self._channel.queue_delete(queue)
        except Exception as error:
            logger.warning("Could not remove the auto-delete queue %r: %r", queue, error)
