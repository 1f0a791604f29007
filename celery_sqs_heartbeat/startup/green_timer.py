"""A gevent worker's timer made to stop a repeated call when asked: its heartbeats outlived
every lost connection, each holding the connection it was started with.

Celery's consumer starts a heart at every connect (``celery.worker.heartbeat.Heart``): a
call of the worker's timer repeated every 2 s (kombu's ``Timer.call_repeatedly``), which
sends ``worker-heartbeat`` through that connection's event dispatcher. When the
connection is lost, the heart is stopped with ``timer.cancel(handle)``, the handle being
what ``call_repeatedly`` returned: what the timer's ``enter_after`` returned for the
first run. kombu's timer returns the entry itself, whose cancel ends the repetition;
Celery's gevent timer (``celery.concurrency.gevent.Timer``, as of Celery 5.7.0) returns the
greenlet of the first run, whose cancel kills that greenlet, long finished, while the
entry, which each run schedules again in a new greenlet, is never marked cancelled.

So in a gevent worker every heart ever started kept beating, and kept its dispatcher, the
closed connection, its transport and channels, and their botocore clients, each holding
its own parse of botocore's service and endpoint data (some 7.6 MiB a client): the chaos
soak's gevent worker grew from 143 to 442 MiB in 30 minutes and 24 lost connections
(issue 33, docs/benchmarks.md).

:func:`mend_gevent_timer` gives that timer a cancel that marks the entry cancelled, so no
run schedules another, and kills its run still pending, so a stopped heart does not beat
once more; a handle without an ``entry`` is cancelled as before. Other timers are left as
they are: they return the entry itself. (Celery's eventlet timer returns a green thread
too, and may hold the same leak; its threads are killed otherwise, and it is not checked.)
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["cancel_repeated_calls", "mend_gevent_timer"]


def mend_gevent_timer(timer: Any) -> bool:
    """Whether ``timer`` is Celery's gevent timer, given :func:`cancel_repeated_calls`.

    Read from the modules already imported: a worker whose pool is not gevent's never
    imported it, and has nothing to mend.
    """
    gevent_pool = sys.modules.get("celery.concurrency.gevent")
    if gevent_pool is None or not isinstance(timer, gevent_pool.Timer):
        return False
    cancel_repeated_calls(timer)
    return True


def cancel_repeated_calls(timer: Any) -> None:
    """Make ``timer.cancel`` end a repeated call whose handle is a greenlet of its runs.

    ``timer`` holds a greenlet per pending run in its ``queue``, each with the ``entry`` it
    runs, as Celery's gevent timer does. Installed once per timer.
    """
    if getattr(timer.cancel, "ends_repeated_calls", False):
        return
    cancel_handle = timer.cancel

    def cancel(handle: Any) -> None:
        entry = getattr(handle, "entry", None)
        if entry is not None:
            # Only a green timer's handles have an entry, and greenlet comes with gevent.
            import greenlet

            entry.cancel()
            # A run that cancels its own call ends by itself (its entry is cancelled now).
            running = greenlet.getcurrent()
            for pending in [run for run in timer.queue if run.entry is entry]:
                if pending is not handle and pending is not running:
                    pending.kill(block=False)
        cancel_handle(handle)

    cancel.ends_repeated_calls = True  # type: ignore[attr-defined]
    timer.cancel = cancel
