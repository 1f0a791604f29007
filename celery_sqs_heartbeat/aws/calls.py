"""SQS calls side by side: a thread each, at most so many of one kind on the wire.

One after another, a slow SQS (2 s a call) would get the tenth call of a burst out 18 s
late, past the end of the leases it carries; and a slow delete would hold back the
renewal behind it. So every call the manager makes runs on a thread of its own, and the
thread that checks the leases only decides and starts calls, never waits for one.

A thread per call, not a pool: calls are at most tens a second, a thread costs about
0.1 ms to start, and nothing idles between bursts. Under gevent the threads are
greenlets. When no thread can be started (at interpreter shutdown) the call is made on
the caller's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["CallSlots"]

#: How long a wait for a slot or for the last call lasts before the waiter looks again:
#: a safety net only, every call that ends wakes the waiters.
CALL_WAIT = 1.0


class CallSlots:
    """Calls of one kind on the wire, each on its own thread, at most ``limit`` at once.

    ``on_done`` runs after each call, once its slot is free: the manager's thread, which
    took no more calls than there were slots, wakes to take the rest.
    """

    def __init__(self, name: str, limit: int, on_done: Callable[[], None]) -> None:
        self.name = name
        self.limit = limit
        self._on_done = on_done
        self._in_flight = 0
        self._changed = threading.Condition()

    @property
    def free(self) -> int:
        with self._changed:
            return self.limit - self._in_flight

    def start(self, call: Callable[[], None]) -> None:
        """Run ``call`` on a thread of its own; it holds a slot until it returns.

        The caller checks :attr:`free` first: a slot is taken even past the limit, since
        refusing here would drop a call whose leases were already taken from the book.
        """
        with self._changed:
            self._in_flight += 1
        thread = threading.Thread(
            target=self._run, args=(call,), name=f"celery-sqs-heartbeat-{self.name}", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:
            self._run(call)

    def _run(self, call: Callable[[], None]) -> None:
        try:
            call()
        finally:
            with self._changed:
                self._in_flight -= 1
                self._changed.notify_all()
            self._on_done()

    def wait_for_a_slot(self) -> None:
        with self._changed:
            while self._in_flight >= self.limit:
                self._changed.wait(CALL_WAIT)

    def wait_until_idle(self) -> None:
        with self._changed:
            while self._in_flight:
                self._changed.wait(CALL_WAIT)
