"""What a failed ReceiveMessage does to its queue, its channel or the worker.

Most failures only delay the queue's next receive (the gate's backoff). A queue that is
gone is one of Celery's remote-control queues, which Celery deletes itself: the channel
stops receiving from it and goes on. Any other error no retry can fix (a wrong name,
region or credentials) stops the worker with the queue and the cause named, where kombu
5.7 would end it on any error and kombu 5.5 would stop receiving without a word; but
never for a queue the channel no longer consumes, whose receive was in flight when its
consumer left (a monitor's event queue, deleted at its exit while its event thread still
polled: stopping then interrupted Flower's exit before the queue was unsubscribed).
"""

from __future__ import annotations

from typing import Any, Protocol

from celery.exceptions import WorkerShutdown
from celery.platforms import EX_FAILURE
from celery.utils.log import get_logger

from ..process import this_process
from .gate import ReceiveGate
from .retries import ReceiveFailure, ends_worker

__all__ = ["FailuresPort", "ReceiveFailures"]

logger = get_logger(__name__)


class FailuresPort(Protocol):
    """What the failure handling reads of, and asks of, its kombu channel."""

    @property
    def _tag_to_queue(self) -> dict[str, str]: ...

    def canonical_queue_name(self, queue_name: str) -> str: ...

    def basic_cancel(self, consumer_tag: str) -> Any: ...


class ReceiveFailures:
    """One channel's answer to failed receives, on both receive paths."""

    def __init__(self, channel: FailuresPort, gate: ReceiveGate) -> None:
        self._channel = channel
        self._gate = gate

    def failed(self, queue_name: str, failure: ReceiveFailure) -> None:
        """A receive from ``queue_name`` failed: back off, stop receiving from a
        remote-control queue that is gone, or stop the worker when no retry can help."""
        this_process().metrics.record_receive_error(failure.code)
        if failure.fatal and not self._consumers_of(queue_name):
            # A receive that was in flight when this channel stopped consuming the queue
            # (a remote-control queue gone and said once; an auto-delete queue it deleted
            # itself at exit): its answer no longer matters.
            return
        if failure.fatal and not ends_worker(failure, queue_name):
            logger.warning(
                "SQS queue %s is gone (%s): Celery creates and deletes its remote-control "
                "queues itself, so this channel stops receiving from it and goes on",
                queue_name,
                failure,
            )
            for tag in self._consumers_of(queue_name):
                self._channel.basic_cancel(tag)
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

    def _consumers_of(self, queue_name: str) -> list[str]:
        """The consumer tags reading ``queue_name``; cancelled, kombu polls it no more.

        None once they were cancelled: several receives of the queue may have been in
        flight when it went (``receives_in_flight``), and each fails alike."""
        channel = self._channel
        return [
            tag
            for tag, queue in list(channel._tag_to_queue.items())
            if channel.canonical_queue_name(queue) == queue_name
        ]
