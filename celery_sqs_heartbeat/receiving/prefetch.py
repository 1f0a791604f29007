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

    ``room`` answers how many more messages the window takes for a queue's next receive
    (None: unlimited; asked with None, for any queue),
    ``wanted`` how much room is worth a receive from a queue (None: from any queue the
    channel consumes), and ``patience`` how long kombu would have waited
    (``polling_interval``). The asynchronous loop (prefork, threads, solo)
    *parks* a queue's receive chain and is told which to wake when acks free room; the
    blocking loop (gevent, eventlet) *waits* in its own greenlet.
    """

    def __init__(
        self,
        room: Callable[[str | None], int | None],
        wanted: Callable[[str | None], int],
        patience: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._room = room
        self._wanted = wanted
        self._patience = patience
        self._clock = clock
        self._changed = threading.Condition()
        #: Parked loops by the token of their park, oldest first: the queue of each and
        #: the room it waits for. A queue with several receive chains may park several.
        self._parked: dict[int, tuple[str, int]] = {}
        self._tokens = itertools.count()
        #: Since when the blocking loop has had less room than a receive is worth.
        self._short_since: float | None = None

    def _has(self, slots: int, queue: str | None = None) -> bool:
        room = self._room(queue)
        return room is None or room >= slots

    def park(self, queue: str, slots: int | None = None) -> int | None:
        """Park a loop of ``queue`` until a receive is worth it (``slots`` of room, by
        default a full call's); the token of its park, or None if it is now."""
        with self._changed:
            wanted = self._wanted(queue) if slots is None else slots
            if self._has(wanted, queue):
                return None
            token = next(self._tokens)
            self._parked[token] = (queue, wanted)
            return token

    def settle_for_any_room(self, queue: str, token: int) -> bool:
        """kombu's wait is over: any room will do. True if the parked loop may receive now.

        Does nothing for a park that has ended (woken already).
        """
        with self._changed:
            if token not in self._parked:
                return False
            if self._has(1, queue):
                del self._parked[token]
                return True
            self._parked[token] = (queue, 1)
            return False

    def freed(self) -> list[str]:
        """Slots were freed: the queue of each parked loop to wake, and blocking waiters are told.

        Oldest park first, each woken for room of its own: two loops waiting for a full
        call each are both woken only by room for two.
        """
        with self._changed:
            self._changed.notify_all()
            rooms: dict[str, int | None] = {}
            woken = []
            for token, (queue, slots) in list(self._parked.items()):
                room = rooms[queue] if queue in rooms else self._room(queue)
                if room is not None and room < slots:
                    continue
                del self._parked[token]
                woken.append(queue)
                rooms[queue] = None if room is None else room - slots
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
