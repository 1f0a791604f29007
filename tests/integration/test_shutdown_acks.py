"""A task that ends during a warm shutdown is deleted then, not when the worker closes.

Kubernetes sends SIGTERM, waits its grace period, then SIGKILLs. A task that ends inside
that period must have its delete sent at once (within ``ack_batch_interval``), while the
worker waits for its other tasks: left to the channel's close, it is never sent if the
worker is killed first, and the task runs again elsewhere (issue 33: a threads worker's
acks waited on an event loop that no longer turned). Counts and orders come from the
strict server's event log and the tasks' own records.
"""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack

import pytest

from tests.integration.harness import Bed, Sent, Worker, report, send_recorded, wait_for
from tests.integration.test_worker_stops import (
    BUSY,
    QUEUE_VISIBILITY,
    RECEIVE_SLACK,
    events_of,
    kill_leftovers,
    lease_end,
    of_action,
    start,
)

#: The lease the workers ask for: a message of the killed worker comes back this soon.
LEASE = 4
#: The task that ends during the shutdown.
SHORT_SECONDS = 3
#: The task that keeps the worker in its shutdown: only a failure guard, the delete of the
#: short task must come before it ends, which it does within ``ack_batch_interval``.
LONG_SECONDS = 20
#: Failure guard on a worker's start and a task's receive.
GUARD = 30


def received(process: Worker, task: Sent) -> bool:
    return f"Task {BUSY}[{task.task_id}] received" in process.log


def ok_deletes(bed: Bed, task: Sent) -> list[dict[str, object]]:
    return [e for e in of_action(events_of(bed, task), "delete") if e["result"] == "ok"]


def started(bed: Bed, task: Sent) -> bool:
    """Whether the task began to run (its line in the worker's ``IT_START_FILE``)."""
    path = bed.logs / "starts.jsonl"
    return path.exists() and task.task_id in path.read_text()


def ended(bed: Bed, label: str) -> bool:
    return any(record["name"] == label for record in bed.executions())


@pytest.mark.parametrize("pool", ["threads", "prefork", "gevent"])
def test_a_task_ending_during_a_warm_shutdown_is_deleted_before_the_worker_is_killed(
    bed: Bed, pool: str
) -> None:
    bed.create_queue(visibility_timeout=QUEUE_VISIBILITY)
    options = {"visibility_timeout": LEASE}
    with ExitStack() as stack:
        first = start(
            stack, bed, pool, 2, "a", options=options, IT_START_FILE=bed.logs / "starts.jsonl"
        )
        first.wait_ready(GUARD)
        stack.callback(kill_leftovers, first.pool_pids())
        long = send_recorded(bed, "busy", "long", LONG_SECONDS)
        short = send_recorded(bed, "busy", "short", SHORT_SECONDS)
        # Running, not only received: a prefork worker stopping drops the jobs no child has
        # reported taking yet, even one a child took (Celery's AsynPool.flush), and never
        # acks it. That race is Celery's (docs/benchmarks.md, the chaos soak); this test is
        # about the acks of tasks that surely run.
        wait_for(lambda: started(bed, long) and started(bed, short), GUARD, "the starts")
        first.kill(signal.SIGTERM)  # warm shutdown: both tasks are running
        wait_for(lambda: ended(bed, "short"), GUARD, "the short task's end")
        # Until the short task's delete, or whatever comes first without it.
        wait_for(
            lambda: (
                ok_deletes(bed, short) or ended(bed, "long") or first.process.poll() is not None
            ),
            LONG_SECONDS + GUARD,
            "the delete, the long task's end or the worker's exit",
        )
        deleted_first = bool(ok_deletes(bed, short)) and not ended(bed, "long")
        alive = first.process.poll() is None
        first.kill(signal.SIGKILL)  # the grace period is over
        killed_at = time.time()
        first.process.wait(GUARD)
        # A copy of a message left undeleted comes back once its lease ends: the second
        # worker polls until then, and takes the long task if it was killed mid-run.
        second = start(stack, bed, pool, 2, "b", options=options)
        second.wait_ready(GUARD)
        stack.callback(kill_leftovers, second.pool_pids())
        copy_due = max(lease_end(events_of(bed, t), killed_at) for t in (short, long))
        wait_for(lambda: time.time() > copy_due + RECEIVE_SLACK, GUARD, "the last possible copy")
        if not ok_deletes(bed, long):
            wait_for(lambda: received(second, long), GUARD, "the long task's second run")
        first_log, second_log = first.log, second.log
        second.kill(signal.SIGKILL)  # it would run the long task to its end
        second.process.wait(GUARD)
    short_events = events_of(bed, short)
    report(
        f"shutdown-ack/{pool}",
        deleted_before_the_long_task_ended=deleted_first,
        worker_alive_then=alive,
        short_receives=len(of_action(short_events, "receive")),
        short_deletes=len(ok_deletes(bed, short)),
        runs_per_task=bed.runs_per_task(),
    )
    assert deleted_first, f"no delete of the task that ended in the shutdown: {short_events}"
    assert alive
    assert len(of_action(short_events, "receive")) == 1, short_events
    assert len(ok_deletes(bed, short)) == 1, short_events
    assert bed.runs_per_task() == {short.task_id: 1}
    assert f"Task {BUSY}[{short.task_id}] received" not in second_log
    assert "Traceback" not in first_log, first_log
