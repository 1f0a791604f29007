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
from collections.abc import Callable
from typing import Any, Protocol

from .pidbox_names import is_mailbox, is_reply_queue

__all__ = [
    "TimelyPort",
    "TimelyReplies",
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


class TimelyPort(Protocol):
    """What timely replies read of, and ask of, their kombu channel."""

    @property
    def hub(self) -> Any: ...

    @property
    def wait_time_seconds(self) -> int: ...

    def _schedule_queue(self, queue: str) -> None: ...


class TimelyReplies:
    """A channel's reply queues wait no longer than their drain, and its mailbox is polled
    again as soon as its long poll comes back empty.

    ``polling_interval`` is kombu's wait after an empty poll (the connection's).
    """

    def __init__(self, channel: TimelyPort, polling_interval: Callable[[], float]) -> None:
        self._channel = channel
        self._polling_interval = polling_interval
        #: The timeout of the drain_events call running on this channel, if any.
        self._drain_timeout: float | None = None
        #: When each mailbox's poll now out was sent (``time.monotonic``).
        self._mailbox_polls_sent: dict[str, float] = {}

    def drain(self, timeout: float | None, drain: Callable[[], Any]) -> Any:
        """``drain()``, the blocking receives it makes bounded by ``timeout``."""
        self._drain_timeout = timeout
        try:
            return drain()
        finally:
            self._drain_timeout = None

    def wait_for(self, queue: str, wait_time_seconds: int | None) -> int | None:
        """The long poll of a blocking receive on ``queue``: a reply queue's is bounded."""
        if not is_reply_queue(queue):
            return wait_time_seconds
        wait = self._channel.wait_time_seconds if wait_time_seconds is None else wait_time_seconds
        return reply_wait_seconds(wait, self._drain_timeout)

    def poll_sent(self, queue: str) -> None:
        """The event loop sends a long poll on ``queue``: a mailbox's is timed."""
        if is_mailbox(queue):
            self._mailbox_polls_sent[queue] = time.monotonic()

    def next_turn(
        self, queue: str, messages_fetched: Any, kombu_next_turn: Callable[[], None]
    ) -> None:
        """The event loop's next turn on ``queue``: at once after a mailbox's empty long poll.

        kombu's hook after every turn of the asynchronous receive loop (``_loop1``), on
        kombu 5.5 to 5.7; the other queues keep kombu's pace (``kombu_next_turn``).
        """
        sent_at = self._mailbox_polls_sent.pop(queue, None)
        hub = self._channel.hub
        if (
            not messages_fetched
            and hub is not None
            and mailbox_polls_again_at_once(
                sent_at,
                time.monotonic(),
                self._channel.wait_time_seconds,
                self._polling_interval(),
            )
        ):
            hub.call_soon(self._channel._schedule_queue, queue)
            return
        kombu_next_turn()
