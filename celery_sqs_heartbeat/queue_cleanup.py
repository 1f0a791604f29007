"""Auto-delete queues leave SNS when their consumer does, and monitors' queues go.

Monitors and remote control declare their queues ``auto_delete``: a broker deletes such a
queue when its last consumer leaves. SQS has no such thing, and kombu's SQS channel left
every one behind, still subscribed to its SNS topic: each ``celery events`` or Flower
start left a ``celeryev-<uuid>`` queue that kept filling with events, and a stopped
worker's pidbox queue kept collecting broadcasts.

When the last consumer of an auto-delete queue is cancelled (``celery events`` stops,
the channel closes, the worker shuts down), this channel:

- deletes an event monitor's queue (bound to Celery's event exchange), which kombu also
  unsubscribes from its SNS topic: each monitor names its queue with a fresh UUID, so
  the name never comes back;
- only unsubscribes any other, such as a worker's mailbox (``<hostname>.celery.pidbox``)
  or the RPC result backend's queue. Their names come back, at the worker's next start
  and at every reconnect, and SQS refuses to create a queue for 60 s after deleting one
  of the same name (``QueueDeletedRecently``): deleting them would stop a worker
  restarted within the minute, and lose results waiting in the queue. Unsubscribed, a
  mailbox collects nothing more and costs nothing.

A remote-control reply queue, auto-delete too, is bound to no topic, so nothing is done
here: :mod:`.reply_queue_channel` keeps it between calls. An auto-delete queue whose
consumer is never cancelled (Flower's) goes at the process's exit (:mod:`.exit_cleanup`).

A failure here is logged and never raised: the consumer is leaving anyway, and a queue
left behind is what happened before.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any

from celery.events.event import EVENT_EXCHANGE_NAME
from celery.utils.log import get_logger
from kombu.transport import SQS

from .compat import KOMBU_BROADCASTS_THROUGH_SNS
from .exit_cleanup import leftovers

__all__ = ["DeletesAutoDeleteQueues", "is_single_use"]

logger = get_logger(__name__)


def is_single_use(bound_exchanges: Collection[str]) -> bool:
    """Whether a queue bound to these exchanges is never declared again once left.

    An event receiver's queue is ``celeryev.<uuid>``, a fresh UUID for each receiver.
    """
    return EVENT_EXCHANGE_NAME in bound_exchanges


class DeletesAutoDeleteQueues(SQS.Channel):
    """A channel that removes an auto-delete queue once its last consumer is cancelled."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Auto-delete queues this channel declared and has not removed yet.
        self._auto_delete_queues: set[str] = set()

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        declared = super().queue_declare(queue, passive=passive, **kwargs)
        if kwargs.get("auto_delete") and not passive:
            self._auto_delete_queues.add(declared.queue)
            leftovers.add_channel(self, os.getpid())
        return declared

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        cancelled = super().basic_cancel(consumer_tag)
        if (
            queue in self._auto_delete_queues
            and queue not in self._tag_to_queue.values()
            and not self.predefined_queues
        ):
            self._auto_delete_queues.discard(queue)
            self._remove_left_queue(queue)
        return cancelled

    def remove_queues_still_consumed(self) -> None:
        """At exit: the consumers of auto-delete queues never cancelled are, and their queues go.

        Cancelled first, as at any cancel: a thread still polling the queue (Flower's
        event capture) then no longer asks for it, instead of finding it gone and
        taking its absence for a misconfiguration.
        """
        for tag, queue in list(self._tag_to_queue.items()):
            if queue in self._auto_delete_queues:
                self.basic_cancel(tag)

    def _remove_left_queue(self, queue: str) -> None:
        exchanges = [binding.exchange for binding in self.state.queue_bindings(queue)]
        try:
            if is_single_use(exchanges):
                # kombu's queue_delete unsubscribes it from each fanout topic it is bound to.
                self.queue_delete(queue)
            elif KOMBU_BROADCASTS_THROUGH_SNS:
                self._unsubscribe(queue, exchanges)
        except Exception as error:
            logger.warning("Could not remove the auto-delete queue %r: %r", queue, error)

    def _unsubscribe(self, queue: str, exchanges: list[str]) -> None:
        for exchange in exchanges:
            if self._exchange_is_fanout(exchange):
                self.fanout.subscriptions.unsubscribe_queue(
                    queue_name=queue, exchange_name=exchange
                )
