"""Which remote-control reply queues a process keeps between calls, and which may go.

kombu names a reply queue from the host, the process, the thread and the id of the
mailbox object that makes the call, and deleted it after each call. The name comes
back whenever the next call from that thread gets a mailbox at the same address (always
through one mailbox, often through Celery's ``inspect()``, which copies the mailbox for
each call), and SQS refuses to create a queue under a name deleted less than a minute
ago (``QueueDeletedRecently``).

So a reply queue is kept after its call, and deleted only once unused for
:data:`REPLY_QUEUE_IDLE_SECONDS`, or as the process leaves. Where the name does not come
back (Flower makes each call from a pool thread with a fresh mailbox copy, four names a
page refresh), the idle ones go at the next call, so a long-lived monitor keeps only the
queues of its last few minutes. A name that came back after more than that idle time
and within the minute after its delete would still be refused; the idle time is long so
that a program asking every few minutes from one thread keeps its queue.

Pure bookkeeping with the clock passed in: :mod:`.reply_queue_keeper` deletes what
this book says, and :mod:`.exit_cleanup` the rest as the process leaves (at its exit, or
as a prefork pool child ends, where no exit handler runs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["REPLY_QUEUE_IDLE_SECONDS", "ReplyQueueBook"]

#: A kept reply queue unused for this long is deleted at the next call of the process.
REPLY_QUEUE_IDLE_SECONDS = 300.0

Delete = Callable[[], object]


@dataclass
class _Kept:
    pid: int
    last_used: float
    delete: Delete


class ReplyQueueBook:
    """The reply queues kept, by URL, with the process that keeps each; thread safe.

    A forked child inherits a copy of the book: it must not delete its parent's queues,
    so every question names the process asking.
    """

    def __init__(self, idle_seconds: float = REPLY_QUEUE_IDLE_SECONDS) -> None:
        self._idle_seconds = idle_seconds
        self._kept: dict[str, _Kept] = {}
        self._lock = threading.Lock()

    def used(self, url: str, delete: Delete, pid: int, now: float) -> None:
        """Process ``pid`` uses the reply queue at ``url`` now; ``delete`` removes it."""
        with self._lock:
            self._kept[url] = _Kept(pid, now, delete)

    def take_idle(self, pid: int, now: float) -> dict[str, Delete]:
        """The queues of ``pid`` unused for the idle time, no longer kept: delete them."""
        with self._lock:
            return self._take(pid, lambda kept: now - kept.last_used >= self._idle_seconds)

    def take_all(self, pid: int) -> dict[str, Delete]:
        """Every queue ``pid`` keeps, no longer kept: it is leaving, and deletes them."""
        with self._lock:
            return self._take(pid, lambda kept: True)

    def _take(self, pid: int, goes: Callable[[_Kept], bool]) -> dict[str, Delete]:
        taken = {url: kept for url, kept in self._kept.items() if kept.pid == pid and goes(kept)}
        for url in taken:
            del self._kept[url]
        return {url: kept.delete for url, kept in taken.items()}
