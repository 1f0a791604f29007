"""Countdowns longer than SQS's hold limit run once, on time, parked in SQS (issue 18).

SQS's 12-hour hold limit is scaled down to :data:`SHORT_HOLD` seconds on a strict server
of this module's own, and the workers' to :data:`HOLD` (``visibility_extension_max``),
as in ``test_worker_stops``'s hold-limit scenarios. Countdowns are several times that:
a worker holding such a task would lose it to SQS, which hands it to another worker.
Parked, each task comes back every :data:`HOLD` seconds to whichever worker receives
it, is parked again, and is delivered :data:`THRESHOLD` / 2 before its ETA.

Every count comes from the tasks' own records and the server's per-message event log.
"""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack
from datetime import datetime, timedelta, timezone
from typing import Any

from tests.integration.harness import (
    UNDELAYED,
    Bed,
    Sent,
    no_copy_left,
    report,
    send_recorded,
    wait_for,
    wait_out_copies,
)
from tests.integration.sqs_reads import dead_lettered
from tests.integration.test_fifo import fifo_queue
from tests.integration.test_worker_stops import events_of, of_action, start

#: SQS's 12 hours, scaled down; and the workers' hold limit, under it.
SHORT_HOLD = 12
HOLD = 8
LEASE = 4
#: ETAs further away than this are parked; parked ones come back half of it early.
THRESHOLD = 4
#: The workers' options. Their countdowns (a retry's) are published undelayed, as the
#: producers' are (:data:`UNDELAYED`): these ETAs are minutes in SQS's delay range, scaled
#: down, and parking is what is tested here.
OPTIONS = {
    "visibility_timeout": LEASE,
    "visibility_extension_max": HOLD,
    "eta_parking_threshold": THRESHOLD,
    "ack_batch_interval": 0.2,
    **UNDELAYED,
}
#: How long each task runs.
TASK_SECONDS = 0.1
#: How late after its ETA a task may start: only a failure guard of a hold, since what
#: would make it late, a park hiding it past its ETA, the event log shows
#: (:func:`back_by_eta`); Celery's timer on a loaded 2-core machine adds the rest.
LATENESS = float(HOLD)
#: How early, by the wall clock, a task may start. Celery holds it until its ETA, but the
#: gevent pool's timer (``spawn_later``) counts from the event loop's cached clock, which
#: lags by as long as the worker's greenlet has run, or waited for a core, since the loop
#: last woke: parsing the receive's answer, decoding the task, scheduling its ETA. That
#: is milliseconds, 0.01 s seen on a loaded machine. The other pools' timers compare
#: ``monotonic()`` with the ETA and start nothing early. A task run unheld would start
#: at its delivery, a whole lead (``THRESHOLD / 2``) early.
EARLY_START = 0.5


def send_due_in(bed: Bed, label: str, seconds: float, **options: Any) -> tuple[Sent, float]:
    """A task with an absolute ETA ``seconds`` from now; the task and its ETA (epoch)."""
    eta = datetime.now(timezone.utc) + timedelta(seconds=seconds)
    task = send_recorded(
        bed, "busy", label, TASK_SECONDS, eta=eta, transport_options=UNDELAYED, **options
    )
    return task, eta.timestamp()


def lateness(bed: Bed, sent: list[tuple[Sent, float]]) -> dict[str, float]:
    starts = {r["task_id"]: r["start"] for r in bed.executions()}
    return {task.task_id: round(starts[task.task_id] - eta, 2) for task, eta in sent}


def on_time(seconds_late: float) -> bool:
    """Whether a task that started ``seconds_late`` after its ETA (before: < 0) was on time."""
    return -EARLY_START <= seconds_late <= LATENESS


def back_by_eta(bed: Bed, sent: list[tuple[Sent, float]]) -> dict[str, list[float]]:
    """Per task, the hides that ended after its ETA (seconds past it): none, if parked right.

    A park hides a message for whole seconds, until a lead (:data:`THRESHOLD` / 2) before
    the ETA; a hide that ends later makes the task late whatever the machine's load.
    """
    late_hides: dict[str, list[float]] = {}
    for task, eta in sent:
        changes = of_action(events_of(bed, task), "change_visibility")
        ends = [e["t"] + e["visibility"] - eta for e in changes if e["visibility"] > LEASE]
        late_hides[task.task_id] = [round(end, 2) for end in ends if end > 0]
    return late_hides


def test_countdowns_past_the_hold_limit_run_once_on_time_across_pools(short_hold_bed: Bed) -> None:
    """Three workers on the queue (threads, prefork, gevent); ETAs two to four holds away."""
    bed = short_hold_bed
    bed.create_queue(visibility_timeout=60)
    with ExitStack() as stack:
        workers = {
            pool: start(stack, bed, pool, 2, pool, options=OPTIONS)
            for pool in ("threads", "prefork", "gevent")
        }
        for process in workers.values():
            process.wait_ready()
        sent = [send_due_in(bed, f"due-{n}", 2 * HOLD + 4 * n) for n in range(5)]
        last_eta = max(eta for _, eta in sent)
        bed.wait_for_executions(len(sent), timeout=last_eta - datetime.now().timestamp() + 20)
        # No copy can come once the queue is drained; one received before may still run.
        drained = no_copy_left(bed)["drained"]
        wait_out_copies(bed, len(sent), TASK_SECONDS)
        logs = {pool: process.log for pool, process in workers.items()}
    late = lateness(bed, sent)
    receives = {t.task_id: len(of_action(events_of(bed, t), "receive")) for t, _ in sent}
    parks = {pool: log.count("Parking task ") for pool, log in logs.items()}
    report("parking/pools", runs=bed.runs_per_task(), lateness=late, receives=receives, parks=parks)
    assert drained, logs
    assert bed.runs_per_task() == {task.task_id: 1 for task, _ in sent}, logs
    assert all(on_time(seconds) for seconds in late.values()), late
    assert back_by_eta(bed, sent) == {task.task_id: [] for task, _ in sent}, late
    # Parked once at least, most of them twice: every receive but the last hid it again.
    assert all(count >= 2 for count in receives.values()), receives
    assert sum(count >= 3 for count in receives.values()) >= 3, receives
    for task, _ in sent:
        events = events_of(bed, task)
        hides = [e for e in of_action(events, "change_visibility") if e["visibility"] > LEASE]
        assert hides and all(e["result"] == "ok" for e in hides), events
        assert all(e["visibility"] <= HOLD for e in hides), events
    assert sum(parks.values()) >= 2 * len(sent), parks
    # No dead-letter queue: hidden again, never copied.
    assert not any("fresh copy" in log for log in logs.values()), logs
    assert not any("Traceback" in log or "Lost the SQS lease" in log for log in logs.values())


def test_a_parked_task_never_reaches_the_dead_letter_queue_for_waiting(short_hold_bed: Bed) -> None:
    """maxReceiveCount 2, an ETA four holds away: parked and copied, never dead-lettered."""
    bed = short_hold_bed
    bed.create_queue(visibility_timeout=60, max_receive_count=2)
    with ExitStack() as stack:
        workers = [start(stack, bed, "threads", 2, name, options=OPTIONS) for name in "ab"]
        for process in workers:
            process.wait_ready()
        sent = [send_due_in(bed, f"due-{n}", 4 * HOLD + 2 * n) for n in range(2)]
        bed.wait_for_executions(len(sent), timeout=4 * HOLD + 20)
        drained = no_copy_left(bed)["drained"]
        wait_out_copies(bed, len(sent), TASK_SECONDS)
        logs = [process.log for process in workers]
    dead = dead_lettered(bed, wait_seconds=1)
    late = lateness(bed, sent)
    copies = sum(log.count("as a fresh copy") for log in logs)
    report("parking/dlq", runs=bed.runs_per_task(), lateness=late, copies=copies, dead=len(dead))
    assert dead == []
    assert drained, logs
    assert bed.runs_per_task() == {task.task_id: 1 for task, _ in sent}, logs
    assert all(on_time(seconds) for seconds in late.values()), late
    assert back_by_eta(bed, sent) == {task.task_id: [] for task, _ in sent}, late
    assert copies >= len(sent), logs
    assert not any("Traceback" in log for log in logs)


def hidden(bed: Bed, task: Sent) -> bool:
    """Whether SQS confirmed a park of ``task``: a visibility change longer than a lease."""
    changes = of_action(events_of(bed, task), "change_visibility")
    return any(e["visibility"] > LEASE and e["result"] == "ok" for e in changes)


def test_workers_killed_or_stopped_while_tasks_are_parked_lose_and_duplicate_none(
    short_hold_bed: Bed,
) -> None:
    """Parked by "a", which is SIGKILLed; "b" takes over and is stopped (SIGTERM); "c" runs them.

    One task expires before its ETA: it comes back just after it expires and Celery
    discards it, unrun.
    """
    bed = short_hold_bed
    bed.create_queue(visibility_timeout=60)
    with ExitStack() as stack:
        first = start(stack, bed, "prefork", 2, "a", options=OPTIONS)
        first.wait_ready()
        sent = [send_due_in(bed, f"due-{n}", 3 * HOLD + n) for n in range(3)]
        expiring, _ = send_due_in(bed, "expiring", 3 * HOLD, expires=HOLD + 2)
        wait_for(lambda: all(hidden(bed, t) for t, _ in [*sent, (expiring, 0)]), 10, "parks")
        first.kill(signal.SIGKILL)
        second = start(stack, bed, "threads", 2, "b", options=OPTIONS)
        second.wait_ready()
        time.sleep(HOLD)
        assert second.warm_shutdown(30) == 0, second.log
        third = start(stack, bed, "gevent", 2, "c", options=OPTIONS)
        bed.wait_for_executions(len(sent), timeout=max(eta for _, eta in sent) - time.time() + 15)
        drained = no_copy_left(bed)["drained"]
        wait_out_copies(bed, len(sent), TASK_SECONDS)
        logs = {p.log_path.name: p.log_path.read_text() for p in (first, second, third)}
    late = lateness(bed, sent)
    released = [
        e
        for task, _ in [*sent, (expiring, 0)]
        for e in of_action(events_of(bed, task), "change_visibility")
        if e["visibility"] == 0
    ]
    report("parking/restarts", runs=bed.runs_per_task(), lateness=late, released=released)
    assert drained, logs
    assert bed.runs_per_task() == {task.task_id: 1 for task, _ in sent}, logs
    assert all(on_time(seconds) for seconds in late.values()), late
    assert back_by_eta(bed, sent) == {task.task_id: [] for task, _ in sent}, late
    # Nothing of a parked task was in a worker to hand back at shutdown.
    assert released == [], released
    assert any(e["result"] == "ok" for e in of_action(events_of(bed, expiring), "delete")), logs
    assert not any("Traceback" in log for log in logs.values())


def test_a_parked_fifo_task_holds_its_message_group(short_hold_bed: Bed) -> None:
    """The group's next task waits for the parked one, as it waits behind a held one."""
    bed = short_hold_bed
    fifo_queue(bed, 60)
    first, eta = send_due_in(bed, "parked", 2 * HOLD, MessageGroupId="g")
    then = send_recorded(bed, "busy", "then", 0.1, MessageGroupId="g")
    other = send_recorded(bed, "busy", "other", 0.1, MessageGroupId="h")
    with ExitStack() as stack:
        process = start(stack, bed, "threads", 2, "a", options=OPTIONS)
        bed.wait_for_executions(3, timeout=2 * HOLD + 20)
        log = process.log
    runs = {r["name"]: r for r in bed.executions()}
    report("parking/fifo", order=sorted(runs, key=lambda name: runs[name]["start"]))
    assert bed.runs_per_task() == {t.task_id: 1 for t in (first, then, other)}, log
    assert "Parking task " in log, log
    assert runs["other"]["start"] < eta
    assert on_time(runs["parked"]["start"] - eta), runs
    assert back_by_eta(bed, [(first, eta)]) == {first.task_id: []}, runs
    assert runs["then"]["start"] >= runs["parked"]["end"]


def test_a_retry_with_a_countdown_is_parked_too(short_hold_bed: Bed) -> None:
    bed = short_hold_bed
    bed.create_queue(visibility_timeout=60)
    with ExitStack() as stack:
        process = start(stack, bed, "threads", 2, "a", options=OPTIONS)
        process.wait_ready()
        task = send_recorded(bed, "retries_later", "retried", 2 * HOLD)
        runs = bed.wait_for_executions(2, timeout=2 * HOLD + 20)
        drained = no_copy_left(bed)["drained"]
        wait_out_copies(bed, 2, TASK_SECONDS)
        log = process.log
    first, then = sorted(runs, key=lambda run: run["start"])
    report("parking/retry", gap=round(then["start"] - first["start"], 2))
    assert drained, log
    assert [r["name"] for r in bed.executions()] == ["retried-first", "retried"], log
    assert 2 * HOLD <= then["start"] - first["start"] <= 2 * HOLD + LATENESS + 1
    assert f"Parking task tests.integration.app.retries_later[{task.task_id}]" in log, log
