"""A remote-control client's wait for replies ends when its ``--timeout`` says.

``celery inspect ping --timeout 1`` collects replies by calling
``connection.drain_events(timeout=1)`` until one call times out. kombu's SQS channel
drops that timeout and long-polls the reply queue for ``wait_time_seconds`` (10 s by
default), so the last, empty call alone took 10 s, and every ``inspect`` took about
11 s whatever its ``--timeout`` (22 s with ``--timeout 12``: two polls).

Here a blocking receive on a remote-control reply queue waits no longer than the
timeout of the drain it serves, rounded up to the whole second SQS takes. Only reply
queues: a worker's queues and an event monitor's (``celery events``, Flower) drain with
a short timeout too (kombu's consumers call ``drain_events(timeout=1)`` in a loop), and
bounding theirs would make each idle one poll ten times as often.

The worker's side: after an empty long poll, kombu's event loop waits
``polling_interval`` (1 s) before polling a queue again, and a command sent meanwhile
waited for it, too long for Celery's default timeout of 1 s. A worker's mailbox is
polled again at once instead: an idle worker's mailbox then costs one ReceiveMessage
per ``wait_time_seconds`` instead of one per ``wait_time_seconds + polling_interval``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from kombu.transport import SQS

__all__ = ["RepliesWithinTheirTimeout", "is_mailbox", "is_reply_queue", "reply_wait_seconds"]

#: kombu's Mailbox names its reply queue ``<oid>.reply.<namespace>.pidbox``, and a
#: worker's mailbox ``<hostname>.<namespace>.pidbox``; SQS's names have dashes for dots.
_REPLY_QUEUE = re.compile(r".+[.-]reply[.-].+[.-]pidbox")
_PIDBOX_QUEUE = re.compile(r".+[.-]pidbox")


def is_reply_queue(queue: str) -> bool:
    """Whether ``queue`` is a remote-control client's reply queue (kombu or SQS name)."""
    return _REPLY_QUEUE.fullmatch(queue) is not None


def is_mailbox(queue: str) -> bool:
    """Whether ``queue`` is a worker's remote-control mailbox (kombu or SQS name)."""
    return _PIDBOX_QUEUE.fullmatch(queue) is not None and not is_reply_queue(queue)


def reply_wait_seconds(wait_time_seconds: int, drain_timeout: float | None) -> int:
    """The long poll of a reply queue: ``wait_time_seconds``, or less if the drain ends sooner.

    SQS takes whole seconds; a timeout is rounded up, so a drain never times out before
    its receive had the whole timeout to bring a reply. Never 0 from a positive wait:
    kombu reads a 0 as "not given" and would wait ``wait_time_seconds``.
    """
    if drain_timeout is None or wait_time_seconds <= 0:
        return wait_time_seconds
    return max(1, min(wait_time_seconds, math.ceil(drain_timeout)))


class RepliesWithinTheirTimeout(SQS.Channel):
    """A channel whose reply queues wait no longer than their drain, and whose mailbox
    is always polled."""

    #: The timeout of the drain_events call running on this channel, if any.
    _drain_timeout: float | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        #: Mailboxes whose long poll is out: its empty answer is no reason to wait.
        self._long_polled_mailboxes: set[str] = set()

    def drain_events(
        self, timeout: float | None = None, callback: Any = None, **kwargs: Any
    ) -> Any:
        self._drain_timeout = timeout
        try:
            return super().drain_events(  # type: ignore[no-untyped-call]
                timeout=timeout, callback=callback, **kwargs
            )
        finally:
            self._drain_timeout = None

    def _receive_message(
        self, queue: str, max_number_of_messages: int = 1, wait_time_seconds: int | None = None
    ) -> Any:
        if is_reply_queue(queue):
            wait = self.wait_time_seconds if wait_time_seconds is None else wait_time_seconds
            wait_time_seconds = reply_wait_seconds(wait, self._drain_timeout)
        return super()._receive_message(
            queue=queue,
            max_number_of_messages=max_number_of_messages,
            wait_time_seconds=wait_time_seconds,
        )

    def _get_bulk_async(self, queue: str, callback: Any = None) -> Any:
        if is_mailbox(queue) and self.wait_time_seconds > 0:
            self._long_polled_mailboxes.add(queue)
        return super()._get_bulk_async(queue, callback)  # type: ignore[no-untyped-call]

    def _loop1(self, queue: str, messages_fetched: Any = None) -> None:
        """The event loop's next turn on ``queue``: at once after a mailbox's long poll.

        Only after a long poll, which took its time: kombu also comes here without one
        when the channel may not consume, and a turn at once then would spin.
        """
        long_polled = queue in self._long_polled_mailboxes
        self._long_polled_mailboxes.discard(queue)
        if long_polled and not messages_fetched and self.hub is not None:
            self.hub.call_soon(self._schedule_queue, queue)
            return
        super()._loop1(queue, messages_fetched)  # type: ignore[no-untyped-call]
