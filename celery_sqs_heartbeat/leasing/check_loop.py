"""The manager's one thread: sleep until something is owed, then check, forever.

Kept apart from what a check decides so that the thread's life (started on first use,
woken early, stopped at exit) reads in one place. The thread shares the manager's lock
through ``condition``: whoever changes what is owed while holding that lock can wake it.
It logs with the manager's logger, where operators look for renewals.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["CheckLoop"]


class CheckLoop:
    """Runs ``check`` whenever ``owed_in`` (asked under the lock) says it is time."""

    def __init__(
        self,
        condition: threading.Condition,
        owed_in: Callable[[], float | None],
        check: Callable[[], None],
        clock: Callable[[], float],
        logger: logging.Logger,
    ) -> None:
        self._changed = condition
        self._logger = logger
        self._owed_in = owed_in
        self._check = check
        self._clock = clock
        self._thread: threading.Thread | None = None
        self._stopped = False
        #: When the sleeping thread wakes by itself: callers that need it sooner wake it.
        self.sleeping_until = float("inf")

    def ensure_running(self) -> None:
        with self._changed:
            if self._stopped or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(
                target=self.run, name="celery-sqs-heartbeat", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float) -> None:
        """End the thread after its current check; it is not started again."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def run(self) -> None:
        while True:
            with self._changed:
                if self._stopped:
                    return
                timeout = self._owed_in()
                now = self._clock()
                self.sleeping_until = float("inf") if timeout is None else now + timeout
                self._changed.wait(timeout)
                self.sleeping_until = float("-inf")
            try:
                self._check()
            except Exception:
                # A bug must not end renewals for the whole process; log it and go on.
                self._logger.exception("Renewing SQS message visibility failed")
