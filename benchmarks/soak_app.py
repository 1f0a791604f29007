"""The Celery app the chaos soak runs in its ``celery worker`` processes (and its monitors).

Configured from the environment, as ``chaos_soak.py`` starts each process:

``SOAK_BROKER_URL``, ``SOAK_TRANSPORT_OPTIONS`` (JSON)
    the strict server, and the workers' ``broker_transport_options``
``SOAK_QUEUES``
    the queues the workers consume, comma separated (a standard one and a FIFO one)
``SOAK_RECORDS``
    the file every run and every receive appends a JSON line to
``SOAK_WORKER``
    this worker's incarnation (``w2.3``: slot 2, third start), written in each record
``SOAK_EVENT_QUEUE_TTL``
    Celery's ``event_queue_ttl``, the retention of a monitor's event queue: longer than
    the run, because the strict server (moto) hands out nothing more from a queue whose
    oldest message is past retention (tests/testbed/test_retention.py), and the reaper
    would find a killed monitor's queue empty and keep it

``SOAK_TRACEMALLOC`` (optional, for diagnosing memory)
    a path with ``{worker}`` in it: the worker traces its allocations from its start
    (``tracemalloc``, 10 frames) and, every ``SOAK_TRACEMALLOC_EVERY`` seconds (60), writes
    there the lines whose memory grew most since then, by traceback; each prefork pool
    process too, as ``{worker}`` followed by ``-child-`` and its pid

A task that raised (a planned failure, a retry) is followed by a full garbage collection:
Celery's trace keeps the exception's traceback in reference cycles (billiard's
``ExceptionInfo``, on Python 3.11 with each frame's code positions) that only a full
collection frees, and Python runs those the less often the larger the heap (Celery's
issue #8882, on any broker). Without it a prefork worker's pool processes grew about
1.4 MiB a minute in the 30-minute soak, every traced allocation that grew being those
tracebacks, and the soak's memory check measured Celery's garbage, not the transport.

Acks are late and a failure is not acked: with ``release_on_failure`` a failed task's
message goes back to SQS after ``release_delay`` (a backoff), as production sets it.

SIGUSR2 drops the worker's broker connection once, as a network would: the error surfaces
in the consumer's loop, which Celery treats as a lost connection and restarts (the same
two paths as ``tests/integration/app.py``'s ``IT_DROP_CONNECTION_AFTER``, on demand).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time
import tracemalloc
from typing import Any

from celery import Celery, signals, states
from celery.exceptions import Retry
from kombu import Exchange, Queue

app = Celery("soak_app")
app.conf.update(
    broker_url=os.environ["SOAK_BROKER_URL"],
    broker_transport="celery_sqs_heartbeat:Transport",
    broker_transport_options=json.loads(os.environ.get("SOAK_TRANSPORT_OPTIONS", "{}")),
    broker_connection_retry_on_startup=True,
    task_acks_late=True,
    task_acks_on_failure_or_timeout=False,
    worker_prefetch_multiplier=2,
    worker_hijack_root_logger=False,
    event_queue_ttl=float(os.environ.get("SOAK_EVENT_QUEUE_TTL", "5")),
    task_queues=[
        Queue(name, Exchange(name), routing_key=name)
        for name in filter(None, os.environ.get("SOAK_QUEUES", "").split(","))
    ],
)

RECORD_FILE = os.environ.get("SOAK_RECORDS", os.devnull)
WORKER = os.environ.get("SOAK_WORKER", "")
#: How many planned failures a ``released`` task has before it succeeds.
FAILURES = 2


def _append(record: dict[str, Any]) -> None:
    """One small O_APPEND write, so that the processes' lines never interleave."""
    line = json.dumps({**record, "worker": WORKER, "pid": os.getpid()}) + "\n"
    fd = os.open(RECORD_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _record_run(task_id: str | None, started: float, outcome: str) -> None:
    _append(
        {
            "event": "run",
            "task_id": task_id,
            "start": started,
            "end": time.time(),
            "outcome": outcome,
        }
    )


def _failures_so_far(task_id: str) -> int:
    """The planned failures recorded for this task, by any worker: each run reads them, so a
    rerun after a SIGKILL does not fail again for nothing."""
    with open(RECORD_FILE) as records:
        return sum(
            1 for line in records if task_id in line and json.loads(line).get("outcome") == "failed"
        )


@app.task(bind=True)  # type: ignore[untyped-decorator]
def work(self: Any, seconds: float, payload: str = "") -> None:
    """Stands for a job of ``seconds`` (longer than the lease, or not); ``payload`` makes
    its message as large as wanted (through S3)."""
    started = time.time()
    time.sleep(seconds)
    _record_run(self.request.id, started, "ok")


@app.task(bind=True)  # type: ignore[untyped-decorator]
def fails_then_succeeds(self: Any) -> None:
    """Fails its first :data:`FAILURES` runs; each failure is released with a backoff."""
    started = time.time()
    if _failures_so_far(self.request.id) < FAILURES:
        _record_run(self.request.id, started, "failed")
        raise RuntimeError("a planned failure of the soak")
    _record_run(self.request.id, started, "ok")


@app.task(bind=True, max_retries=5)  # type: ignore[untyped-decorator]
def retries_once(self: Any) -> None:
    """Retries once, 2 s later: the retry is a new message the worker publishes.

    ``retry`` is recorded only once the retry is published (``Retry`` raised): a publish
    that failed in an outage fails the run, whose message is released and runs again.
    """
    started = time.time()
    if not self.request.retries:
        try:
            self.retry(countdown=2)
        except Retry:
            _record_run(self.request.id, started, "retry")
            raise
    _record_run(self.request.id, started, "ok")


@signals.task_received.connect
def _record_receipt(request: Any, **_: Any) -> None:
    """When this worker took the task: where its hold of the message began."""
    _append({"event": "received", "task_id": request.id, "at": time.time()})


_drop = threading.Event()


@signals.worker_ready.connect
def _drop_the_connection_on_sigusr2(sender: Any, **_: Any) -> None:
    signal.signal(signal.SIGUSR2, lambda *_: _drop.set())
    if sender.hub is None:
        _fail_the_next_drain(sender)
        return
    threading.Thread(target=_lose_on_the_loop, args=(sender.hub,), daemon=True).start()


def _lose() -> None:
    raise ConnectionResetError("connection to SQS dropped by the soak")


def _lose_on_the_loop(hub: Any) -> None:
    """The event loop (prefork, threads, solo) raises it: ``call_soon`` is safe from another
    thread, which a signal handler is not (the loop may hold the lock it takes)."""
    while True:
        _drop.wait()
        _drop.clear()
        hub.call_soon(_lose)


def _fail_the_next_drain(consumer: Any) -> None:
    """Celery's blocking loop (gevent) waits in ``drain_events`` of a connection made anew
    at each reconnect, so the class is patched: the consumer's next wait after a SIGUSR2
    raises. Only the consumer's: the remote-control node's greenlet drains a connection of
    the same class, and a drop it took ended that loop, not the consumer's (no reconnect)."""
    connection_class = type(consumer.connection)
    drain = connection_class.drain_events

    def drain_or_drop(self: Any, **kwargs: Any) -> Any:
        if self is consumer.connection and _drop.is_set():
            _drop.clear()
            _lose()
        return drain(self, **kwargs)

    connection_class.drain_events = drain_or_drop


@signals.task_postrun.connect
def _collect_a_raised_task_s_cycles(state: str | None = None, **_: Any) -> None:
    if state in (states.FAILURE, states.RETRY):
        gc.collect()


@signals.worker_ready.connect
def _trace_allocations_if_asked(**_: Any) -> None:
    _trace_allocations(WORKER)


@signals.worker_process_init.connect
def _trace_a_pool_process_if_asked(**_: Any) -> None:
    """A prefork pool process starts without the parent's thread: it traces on its own."""
    _trace_allocations(f"{WORKER}-child-{os.getpid()}")


def _trace_allocations(name: str) -> None:
    path = os.environ.get("SOAK_TRACEMALLOC")
    if path:
        every = float(os.environ.get("SOAK_TRACEMALLOC_EVERY", "60"))
        target = path.format(worker=name)
        threading.Thread(target=_write_growth, args=(target, every), daemon=True).start()


def _write_growth(path: str, every: float) -> None:
    """Every ``every`` seconds, the 25 tracebacks whose memory grew most since the start."""
    tracemalloc.start(10)
    first = tracemalloc.take_snapshot()
    while True:
        time.sleep(every)
        grown = tracemalloc.take_snapshot().compare_to(first, "traceback")[:25]
        with open(path, "a") as out:
            out.write(f"=== {time.time():.0f} rss-traced {tracemalloc.get_traced_memory()}\n")
            for stat in grown:
                out.write(f"{stat.size_diff / 2**20:+.2f} MiB {stat.count_diff:+d} blocks\n")
                out.write("".join(f"    {line}\n" for line in stat.traceback.format()))
