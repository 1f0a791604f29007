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

The worker's side: kombu 5.7's event loop waits ``polling_interval`` (1 s) after an
empty long poll before polling the queue again, and a command sent meanwhile waited
for it, too long for Celery's default timeout of 1 s. A worker's mailbox is polled
again at once instead, as kombu 5.5 and 5.6 poll every queue, but only after a long
poll that was out for its whole ``wait_time_seconds`` (or ``polling_interval``, if that
is shorter): one that failed at once, a short poll (``wait_time_seconds`` 0), or one
that never went out because the channel may not consume, is followed by kombu's own
wait. An idle mailbox costs one ReceiveMessage per ``wait_time_seconds``, instead of one
per ``wait_time_seconds + polling_interval``, and never spins.
"""

from __future__ import annotations

import math
import time
from typing import Any

from kombu.transport import SQS

from .pidbox_names import is_mailbox, is_reply_queue

__all__ = [
    "RepliesWithinTheirTimeout",
    "mailbox_polls_again_at_once",
    "reply_wait_seconds",
]


def reply_wait_seconds(wait_time_seconds: int, drain_timeout: float | None) -> int:
    """The long poll of a reply queue: ``wait_time_seconds``, or less if the drain ends sooner.

    SQS takes whole seconds; a timeout is rounded up, so a drain never times out before
    its receive had the whole timeout to bring a reply. Never 0 from a positive wait:
    kombu reads a 0 as "not given" and would wait ``wait_time_seconds``.
    """
    if drain_timeout is None or wait_time_seconds <= 0:
        return wait_time_seconds
    return max(1, min(wait_time_seconds, math.ceil(drain_timeout)))


def mailbox_polls_again_at_once(
    sent_at: float | None, answered_at: float, wait_time_seconds: float, polling_interval: float
) -> bool:
    """Whether a mailbox's empty poll, sent at ``sent_at``, may be followed by the next at once.

    Only a long poll that was out for its whole wait, or for kombu's ``polling_interval``
    if that is shorter: it already waited as long as kombu would have. A poll that came
    back sooner failed, a short poll (``wait_time_seconds`` 0) takes no time, and one
    never sent (``None``: the channel may not consume) took none; polling again at once
    after those would spin.
    """
    if sent_at is None or wait_time_seconds <= 0:
        return False
    return answered_at - sent_at >= min(wait_time_seconds, polling_interval)


class RepliesWithinTheirTimeout(SQS.Channel):
    """A channel whose reply queues wait no longer than their drain, and whose mailbox
    is polled again as soon as its long poll comes back empty."""

    #: The timeout of the drain_events call running on this channel, if any.
    _drain_timeout: float | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        #: When each mailbox's poll now out was sent (``time.monotonic``).
        self._mailbox_polls_sent: dict[str, float] = {}

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
        if is_mailbox(queue):
            self._mailbox_polls_sent[queue] = time.monotonic()
        return super()._get_bulk_async(queue, callback=callback)  # type: ignore[no-untyped-call]

    def _loop1(self, queue: str, messages_fetched: Any = None) -> None:
        """The event loop's next turn on ``queue``: at once after a mailbox's empty long poll.

        kombu's hook after every turn of the asynchronous receive loop, on kombu 5.5 to
        5.7; the other queues keep kombu's pace.
        """
        sent_at = self._mailbox_polls_sent.pop(queue, None)
        polling_interval = float(self.connection.polling_interval or 0)
        if (
            not messages_fetched
            and self.hub is not None
            and mailbox_polls_again_at_once(
                sent_at, time.monotonic(), self.wait_time_seconds, polling_interval
            )
        ):
            self.hub.call_soon(self._schedule_queue, queue)
            return
        super()._loop1(queue, messages_fetched)  # type: ignore[no-untyped-call]
