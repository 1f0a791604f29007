"""When the worker asks SQS for more: as soon as acks make room in the prefetch window.

kombu's SQS channel receives only while Celery's prefetch window has room. Once the
window is full it looks again ``polling_interval`` later (1 s by default), whatever
happens meanwhile: a pool that finishes its tasks in 50 ms then idles for the rest of
the second, on every turn. Measured with 20 ms tasks, prefork -c 4 and 15 ms per SQS
call, kombu's own transport ran 16 tasks/s, in bursts of 16 with 0.8 s gaps.

Here an ack that frees enough of the window wakes the receive loop at once. Not on the
first free slot: a ReceiveMessage per freed slot would cost a call per message. The loop
waits for room for a full call (ten messages, SQS's limit) or half the window if that
is smaller, so the pool still holds half its window while the receive is on the wire.
kombu's ``polling_interval`` stays the longest wait: after it, any room will do, as in
kombu. Nothing here talks to SQS; acks come from pool threads and greenlets, so every
method is thread-safe.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable

from ..aws.sqs_facts import SQS_MAX_MESSAGES

__all__ = ["PrefetchRoom", "full_call_room"]


def full_call_room(prefetch_count: int) -> int:
    """Free slots worth a ReceiveMessage of their own: a full call, or half the window."""
    return max(1, min(SQS_MAX_MESSAGES, math.ceil(prefetch_count / 2)))


class PrefetchRoom:
    """One channel's prefetch window, as the receive loops wait on it.

    ``room`` answers how many more messages the window takes (None: unlimited),
    ``wanted`` how much room is worth a receive from a queue (None: from any queue the
    channel consumes), and ``patience`` how long kombu would have waited
    (``polling_interval``). The asynchronous loop (prefork, threads, solo)
    *parks* a queue and is told which queues to wake when acks free room; the blocking
    loop (gevent, eventlet) *waits* in its own greenlet.
    """

    def __init__(
        self,
        room: Callable[[], int | None],
        wanted: Callable[[str | None], int],
        patience: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._room = room
        self._wanted = wanted
        self._patience = patience
        self._clock = clock
        self._changed = threading.Condition()
        #: Parked queues: the room each waits for, and the token of its park.
        self._parked: dict[str, tuple[int, int]] = {}
        self._tokens = itertools.count()
        #: Since when the blocking loop has had less room than a receive is worth.
        self._short_since: float | None = None

    def _has(self, slots: int) -> bool:
        room = self._room()
        return room is None or room >= slots

    def park(self, queue: str) -> int | None:
        """Park ``queue``'s loop until a receive is worth it; its token, or None if it is now."""
        with self._changed:
            wanted = self._wanted(queue)
            if self._has(wanted):
                return None
            token = next(self._tokens)
            self._parked[queue] = (wanted, token)
            return token

    def settle_for_any_room(self, queue: str, token: int) -> bool:
        """kombu's wait is over: any room will do. True if ``queue`` may receive now.

        Does nothing for a park that has ended (``token`` is of an older one).
        """
        with self._changed:
            if self._parked.get(queue, (0, None))[1] != token:
                return False
            if self._has(1):
                del self._parked[queue]
                return True
            self._parked[queue] = (1, token)
            return False

    def freed(self) -> list[str]:
        """Slots were freed: the parked queues to wake, and blocking waiters are told."""
        with self._changed:
            self._changed.notify_all()
            woken = [queue for queue, (slots, _) in self._parked.items() if self._has(slots)]
            for queue in woken:
                del self._parked[queue]
            return woken

    def forget(self) -> None:
        """The channel is closing: nothing parked is to be woken."""
        with self._changed:
            self._parked.clear()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` until a receive is worth it; whether it is.

        Room for a full call is worth it at once; any room is, once the loop has been
        short of room for ``patience``.
        """
        with self._changed:
            return self._changed.wait_for(self._worth_receiving, timeout)

    def _worth_receiving(self) -> bool:
        if self._has(self._wanted(None)):
            self._short_since = None
            return True
        now = self._clock()
        if self._short_since is None:
            self._short_since = now
        if self._has(1) and now - self._short_since >= self._patience():
            self._short_since = None
            return True
        return False
