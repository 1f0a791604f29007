"""The Celery app that ``worker_throughput.py`` runs in real ``celery worker`` processes.

Configured only through environment variables, so that one module serves both
transports and every pool: the benchmark changes nothing but ``BENCH_TRANSPORT``
between the two sides of a comparison.

``BENCH_BROKER_URL``
    the SQS server, e.g. ``sqs://testing:testing@127.0.0.1:PORT``
``BENCH_TRANSPORT``
    ``sqs`` (kombu's stock transport) or ``celery_sqs_heartbeat:Transport``
``BENCH_TRANSPORT_OPTIONS``
    JSON ``broker_transport_options``, identical for both transports
``BENCH_QUEUE``
    the queue to consume (a fresh one per run)
``BENCH_RECORD_FILE``
    where every execution appends one JSON line: task id, pid, start, end
``BENCH_PREFETCH``
    ``worker_prefetch_multiplier`` (Celery's default, 4, unless set)
``BENCH_CPU_GATE``
    a path prefix: when ready, the worker holds until ``PREFIX.go`` exists, then writes
    the CPU its process and pool have used so far to ``PREFIX.cpu`` (``cpu_per_task.py``)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery import Celery, signals
from proc_cpu import tree_cpu

app = Celery("bench_app")
app.conf.update(
    broker_url=os.environ["BENCH_BROKER_URL"],
    broker_transport=os.environ["BENCH_TRANSPORT"],
    broker_transport_options=json.loads(os.environ.get("BENCH_TRANSPORT_OPTIONS", "{}")),
    broker_connection_retry_on_startup=False,
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    # The heartbeat only matters when the message is deleted after the task: with early
    # acks neither transport can run a task twice, and there is nothing to compare.
    task_acks_late=True,
    worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
    worker_hijack_root_logger=False,
)

RECORD_FILE = os.environ.get("BENCH_RECORD_FILE", os.devnull)
CPU_GATE = os.environ.get("BENCH_CPU_GATE")


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def _hold_until_measured(**_: Any) -> None:
    """Celery sends ``worker_ready`` after the consumer is set up and before its event loop
    first runs, so nothing is received yet: held here, the worker lets the benchmark
    attach a profiler, and its CPU read at the release is the start of the load exactly."""
    if CPU_GATE is None:
        return
    Path(f"{CPU_GATE}.held").touch()
    go = Path(f"{CPU_GATE}.go")
    while not go.exists():
        time.sleep(0.01)
    Path(f"{CPU_GATE}.cpu").write_text(json.dumps(tree_cpu(os.getpid())))


def _record(task_id: str | None, started: float) -> None:
    """Append one execution; a single small O_APPEND write, so processes never interleave."""
    line = json.dumps(
        {"task_id": task_id, "pid": os.getpid(), "start": started, "end": time.time()}
    )
    fd = os.open(RECORD_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@app.task(bind=True)  # type: ignore[untyped-decorator]
def noop(self: Any) -> None:
    """Does nothing, so the run measures the transport and the worker, not the task."""
    _record(self.request.id, time.time())


@app.task(bind=True)  # type: ignore[untyped-decorator]
def takes(self: Any, data: str) -> None:
    """Takes an argument of the size under test (``large_payloads.py``) and nothing else."""
    _record(self.request.id, time.time())


@app.task(bind=True)  # type: ignore[untyped-decorator]
def sleep_for(self: Any, seconds: float) -> None:
    """Stands for a job that outlives the visibility timeout."""
    started = time.time()
    time.sleep(seconds)
    _record(self.request.id, started)
