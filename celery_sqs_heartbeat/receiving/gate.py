"""When a queue may receive, and what its receives left on the wire: pure, clock passed in.

The receive loop asks two things of a queue before each turn, and one at shutdown:

- Is it failing? A failed receive is retried with backoff
  (:class:`~celery_sqs_heartbeat.receiving.retries.ReceiveBackoff`), and the streak is logged
  once when it starts and once when it ends, not on every retry.
- Which long polls are on the wire, and since when? A message released at shutdown
  before this channel's own pending poll is over could be handed to that poll, whose
  answer nobody reads any more: it would stay hidden for a whole lease. So the release
  waits until the poll must be over.

The prefetch window, the third thing a turn depends on, is
:class:`~celery_sqs_heartbeat.receiving.prefetch.PrefetchRoom`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from celery.utils.log import get_logger

from .retries import ReceiveBackoff, ReceiveFailure

__all__ = ["ReceiveGate"]

logger = get_logger(__name__)


class ReceiveGate:
    """One channel's receive backoff and pending long polls, per queue."""

    def __init__(self, clock: Callable[[], float], backoff: ReceiveBackoff | None = None) -> None:
        self._clock = clock
        self._backoff = backoff if backoff is not None else ReceiveBackoff()
        #: The long polls on the wire, by token: their queue's URL, when each was sent and
        #: how long SQS may hold it. A queue may have several (``receives_in_flight``).
        self._polls_pending: dict[int, tuple[str, float, int]] = {}
        self._tokens = itertools.count()

    def wait(self, queue_name: str) -> float:
        """Seconds before ``queue_name`` may be asked again; 0: now."""
        return self._backoff.wait(queue_name, self._clock())

    def poll_sent(self, queue_url: str, wait_time_seconds: int) -> int:
        """A receive goes out on ``queue_url``; the token its answer hands back."""
        token = next(self._tokens)
        self._polls_pending[token] = (queue_url, self._clock(), wait_time_seconds)
        return token

    def poll_answered(self, token: int) -> float | None:
        """The poll of ``token`` came back: when it was sent (None: not known)."""
        pending = self._polls_pending.pop(token, None)
        return None if pending is None else pending[1]

    def release_delay(self, queue_url: str) -> int:
        """Seconds until every pending poll of this channel's on the queue must be over."""
        now = self._clock()
        ends = [
            sent_at + wait - now
            for url, sent_at, wait in self._polls_pending.values()
            if url == queue_url
        ]
        return max(0, math.ceil(max(ends, default=0)))

    def failed(self, queue_name: str, failure: ReceiveFailure) -> None:
        """Back off; a streak that starts now is logged. The caller stops on fatal ones."""
        if self._backoff.failed(queue_name, self._clock()):
            logger.warning(
                "Receiving from SQS queue %s failed (%s); retrying with backoff until it works",
                queue_name,
                failure,
            )

    def now(self) -> float:
        return self._clock()

    def succeeded(self, queue_name: str, sent_at: float | None) -> None:
        """A receive sent at ``sent_at`` worked: a streak of failures since then is over."""
        recovery = self._backoff.succeeded(queue_name, self._clock(), sent_at)
        if recovery is not None:
            logger.info(
                "Receiving from SQS queue %s works again, after %d failed attempt(s) in %.1f s",
                queue_name,
                recovery.failures,
                recovery.seconds,
            )
