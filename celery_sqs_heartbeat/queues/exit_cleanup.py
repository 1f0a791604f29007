"""What a process removes from SQS as it leaves: the queues it made that nobody else will.

Two kinds of queue outlive the consumer that would have removed them:

- Some monitors never cancel their consumer: Flower captures events on a daemon thread
  and exits with it still consuming, so its ``celeryev-<uuid>`` queue stayed, subscribed
  to SNS, at every stop.
- Remote-control reply queues are kept between calls (:mod:`.reply_queues` says why);
  those of the last minutes of a process are left for its exit.

A process's :class:`Leftovers` (:mod:`celery_sqs_heartbeat.process` holds them, and
removes them when the process leaves) removes both, by the rule of
:mod:`~celery_sqs_heartbeat.queues.cleanup`: a single-use queue (a monitor's) is
deleted, and a queue whose name comes back (a worker's mailbox, the RPC backend's) is
left as it is, subscribed. It does so:

- at the interpreter's exit (the end of a script, Ctrl-C, ``sys.exit``, SIGTERM where
  the program exits on it), from an ``atexit`` handler;
- in a prefork pool child as it leaves (``--max-tasks-per-child``, a warm shutdown),
  from Celery's ``worker_process_shutdown`` signal, which billiard's pool worker sends
  in the child just before ending it with ``os._exit``, which runs no ``atexit``
  handler: a task that had called ``inspect()`` left its reply queue for good.

Only the process that declared a queue removes it: a child forked by a prefork pool
starts with leftovers of its own, and must leave the parent's queues alone. A process
killed outright (SIGKILL) runs neither: docs/monitoring.md says what it leaves.

A failure is logged and never raised: the process is leaving anyway, and a queue left
behind is what happened before.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

from celery.utils.log import get_logger

from ..monitoring.reply_queues import Delete, ReplyQueueBook

__all__ = ["ChannelWithLeftovers", "Leftovers", "delete_reply_queues"]

logger = get_logger(__name__)


class ChannelWithLeftovers(Protocol):
    """What removes a channel's auto-delete queues still consumed (its ``AutoDeleteQueues``)."""

    def remove_queues_still_consumed(self) -> None: ...


class Leftovers:
    """The channels and reply queues each process removes at its exit; thread safe."""

    def __init__(self) -> None:
        #: Weakly: a channel gone before the exit has nothing left consumed.
        self._channels: weakref.WeakKeyDictionary[ChannelWithLeftovers, int] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self.reply_queues = ReplyQueueBook()

    def add_channel(self, channel: ChannelWithLeftovers, pid: int) -> None:
        """``channel``, of process ``pid``, declared an auto-delete queue."""
        with self._lock:
            self._channels[channel] = pid

    def remove(self, pid: int) -> None:
        """Remove what process ``pid`` left: its reply queues, its channels' consumed queues."""
        delete_reply_queues(self.reply_queues.take_all(pid))
        with self._lock:
            channels = [channel for channel, owner in self._channels.items() if owner == pid]
        for channel in channels:
            try:
                channel.remove_queues_still_consumed()
            except Exception as error:
                logger.warning("Could not remove the queues %r still consumed: %r", channel, error)


def delete_reply_queues(deletes: dict[str, Delete]) -> None:
    """Delete each reply queue; a failure is logged, and the others still go."""
    for url, delete in deletes.items():
        try:
            delete()
        except Exception as error:
            logger.warning("Could not delete the reply queue %s: %r", url, error)
