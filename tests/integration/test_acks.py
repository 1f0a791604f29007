"""The ack pipeline in real workers: batched deletes, held leases, nothing run twice."""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration.harness import (
    Bed,
    Worker,
    assert_queue_empty,
    log_has,
    report,
    send_recorded,
    tally,
    wait_for,
    worker,
)
from tests.integration.test_worker_stops import events_of, of_action

DELETES = ["DeleteMessage", "DeleteMessageBatch"]
POOLS = [("prefork", 4), ("threads", 4), ("solo", 1), ("gevent", 4)]


def deletes_sent(bed: Bed) -> dict[str, int]:
    calls = bed.server.calls()
    return {action: calls.get(action, 0) for action in DELETES}


@pytest.mark.parametrize("acks_late", ["1", "0"], ids=["late-ack", "early-ack"])
@pytest.mark.parametrize(("pool", "concurrency"), POOLS)
def test_acks_are_deleted_in_batches_on_every_pool(
    bed: Bed, pool: str, concurrency: int, acks_late: str
) -> None:
    tasks = [bed.send("busy", f"t{n}", 0.05) for n in range(25)]
    bed.server.reset_calls()
    with worker(
        bed,
        pool,
        concurrency,
        options={"visibility_timeout": 10},
        IT_ACKS_LATE=acks_late,
        IT_PREFETCH_MULTIPLIER=4,
    ) as process:
        bed.wait_for_executions(len(tasks), timeout=60)
        wait_for(lambda: bed.server.batch_entries().get("DeleteMessageBatch", 0) >= 25, 10)
        log = process.log
    sent = deletes_sent(bed)
    mode = "late" if acks_late == "1" else "early"
    report(f"batched acks/{pool}/{mode}", **tally(bed, tasks), calls=bed.server.calls())
    assert bed.runs_per_task() == dict.fromkeys(tasks, 1), log
    assert sent["DeleteMessage"] == 0, sent
    # 25 acks in fewer calls than messages: batching works on this pool.
    assert 3 <= sent["DeleteMessageBatch"] < 25, sent
    assert_queue_empty(bed)
    assert "Couldn't ack" not in log


@pytest.mark.parametrize(("pool", "concurrency"), POOLS)
def test_deletes_failing_for_longer_than_a_lease_run_no_task_twice(
    bed: Bed, pool: str, concurrency: int
) -> None:
    """The issue's scenario: every delete fails for 8 s on a 5 s lease, two workers."""
    lease, outage = 5, 8
    options = {"visibility_timeout": lease}
    tasks = [bed.send("busy", f"t{n}", 1.0) for n in range(4)]
    bed.server.reset_calls()
    first = Worker(bed, pool, concurrency, "first", bed.env(options=options))
    second = Worker(bed, pool, concurrency, "second", bed.env(options=options))
    try:
        first.wait_ready()
        second.wait_ready()
        bed.server.outage(outage, "server_error", actions=DELETES)
        bed.wait_for_executions(len(tasks), timeout=30)
        finished_at = time.monotonic()
        # Past the outage and another lease: a lost lease would have run a task twice.
        time.sleep(max(0.0, outage + lease + 2 - (time.monotonic() - finished_at)))
        assert first.process.poll() is None, first.log
        assert second.process.poll() is None, second.log
        logs = first.log + second.log
    finally:
        first.warm_shutdown()
        second.warm_shutdown()
    report(
        f"failing deletes/{pool}",
        **tally(bed, tasks),
        alive=True,
        calls=bed.server.calls(),
        entries=bed.server.batch_entries(),
    )
    assert bed.runs_per_task() == dict.fromkeys(tasks, 1), logs
    assert_queue_empty(bed)  # the deletes landed once SQS answered again
    assert "Couldn't ack" not in logs
    assert "Lost the SQS lease" not in logs
    assert f"Deleting acked messages on queue {bed.queue} failed" in logs
    assert f"Deleting acked messages on queue {bed.queue} works again" in logs
    assert "Traceback" not in logs


def test_failed_entries_of_a_delete_batch_are_retried_alone(bed: Bed) -> None:
    tasks = [bed.send("busy", f"t{n}", 0.05) for n in range(12)]
    bed.server.reset_calls()
    bed.server.fail_entries("DeleteMessageBatch", "InternalError", count=3)
    # The longest batch wait: the first delete goes out once ten acks wait, so the three
    # failing entries are in one call however slowly the machine runs the tasks.
    options = {"visibility_timeout": 10, "ack_batch_interval": 10}
    with worker(bed, "threads", 4, options=options) as process:
        bed.wait_for_executions(len(tasks), timeout=30)
        wait_for(lambda: not bed.server.pending_faults(), 20)
        wait_for(lambda: bed.server.batch_entries().get("DeleteMessageBatch", 0) >= 15, 20)
        # The server has answered the retry; the worker logs the recovery once it has read it.
        recovered = f"Deleting acked messages on queue {bed.queue} works again"
        wait_for(lambda: recovered in process.log, 5)
        log = process.log
    report(
        "failed entries",
        **tally(bed, tasks),
        calls=bed.server.calls(),
        entries=bed.server.batch_entries(),
    )
    assert bed.runs_per_task() == dict.fromkeys(tasks, 1)
    # Each message deleted once it was asked again: 12 entries, and 3 asked twice.
    assert bed.server.batch_entries()["DeleteMessageBatch"] == 15, log
    assert_queue_empty(bed)
    queue = bed.queue
    assert log.count(f"Deleting acked messages on queue {queue} failed") == 1, log
    assert recovered in log
    assert "Lost the SQS lease" not in log


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGQUIT"], ids=["warm", "cold"])
def test_deletes_still_waiting_are_sent_when_the_worker_stops(bed: Bed, signal_name: str) -> None:
    """With the longest batch wait, the acks are still pending when the worker is told to stop."""
    tasks = [bed.send("busy", f"t{n}", 0.05) for n in range(3)]
    bed.server.reset_calls()
    process = Worker(
        bed,
        "prefork",
        2,
        "w1",
        bed.env(options={"visibility_timeout": 30, "ack_batch_interval": 10}),
    )
    try:
        process.wait_ready()
        bed.wait_for_executions(len(tasks), timeout=30)
        wait_for(lambda: log_has(process, "succeeded in", len(tasks)), 10)
        assert deletes_sent(bed) == {"DeleteMessage": 0, "DeleteMessageBatch": 0}
        process.kill(getattr(signal, signal_name))
        process.process.wait(timeout=30)
        log = process.log
    finally:
        process.warm_shutdown()
    report(
        f"deletes pending at shutdown/{signal_name}", **tally(bed, tasks), calls=bed.server.calls()
    )
    assert deletes_sent(bed) == {"DeleteMessage": 0, "DeleteMessageBatch": 1}, log
    assert bed.runs_per_task() == dict.fromkeys(tasks, 1)
    assert_queue_empty(bed)
    assert "could not be sent" not in log and "were not confirmed" not in log


def test_opting_out_of_batching_deletes_each_ack_on_its_own(bed: Bed) -> None:
    tasks = [bed.send("busy", f"t{n}", 0.05) for n in range(5)]
    bed.server.reset_calls()
    with worker(bed, "prefork", 2, options={"visibility_timeout": 10, "ack_batching": False}):
        bed.wait_for_executions(len(tasks), timeout=30)
        wait_for(lambda: deletes_sent(bed)["DeleteMessage"] >= len(tasks), 10)
    assert deletes_sent(bed) == {"DeleteMessage": len(tasks), "DeleteMessageBatch": 0}
    assert bed.runs_per_task() == dict.fromkeys(tasks, 1)
    assert_queue_empty(bed)


def test_a_fifo_queue_s_deletes_go_out_at_once_so_the_group_moves_on(bed: Bed) -> None:
    """A message group waits for its delete; a batch wait would stall it after every task."""
    bed.queue = f"{bed.queue}.fifo"
    bed.sqs().create_queue(
        QueueName=bed.queue, Attributes={"FifoQueue": "true", "VisibilityTimeout": "30"}
    )
    tasks = [bed.send("busy", f"t{n}", 0.1) for n in range(6)]
    bed.server.reset_calls()
    batch_wait = 10
    options = {"visibility_timeout": 30, "ack_batch_interval": batch_wait}
    with worker(bed, "threads", 4, options=options) as process:
        runs = bed.wait_for_executions(len(tasks), timeout=90)
        wait_for(lambda: bed.server.batch_entries().get("DeleteMessageBatch", 0) >= 6, 20)
        log = process.log
    report(
        "fifo", **tally(bed, tasks), calls=bed.server.calls(), entries=bed.server.batch_entries()
    )
    assert len(runs) == len(tasks), log
    assert bed.runs_per_task() == dict.fromkeys(tasks, 1)
    assert [run["task_id"] for run in sorted(runs, key=lambda run: run["start"])] == tasks
    # One group, in order: the k-th delete belongs to the k-th task to end. Each lands
    # well inside the batch wait after its task ended, instead of waiting it out.
    ends = sorted(run["end"] for run in runs)
    deletes = sorted(
        event["t"]
        for event in bed.server.events()
        if event["queue"] == bed.queue and event["action"] == "delete" and event["result"] == "ok"
    )
    assert len(deletes) == len(tasks), deletes
    assert (
        max(deleted - ended for ended, deleted in zip(ends, deletes, strict=True)) < batch_wait / 2
    )
    assert_queue_empty(bed)


def test_a_solo_workers_ack_goes_out_as_its_task_ends_not_after_the_next_task(
    bed: Bed,
) -> None:
    """The chaos soak: a solo worker runs every message of a receive's answer in one turn of
    its event loop, and a task's ack, queued on that loop, waited for the next task to end
    (12 s there); its delete then failed in an outage past its lease, and it ran again."""
    sent = {label: send_recorded(bed, "busy", label, seconds) for label, seconds in SOLO_TASKS}
    with worker(bed, "solo", 1, IT_PREFETCH_MULTIPLIER=2) as process:
        done = bed.wait_for_executions(2, timeout=60)
        log = process.log
    first, then = sorted(done, key=lambda record: record["end"])
    first_events = events_of(bed, sent[first["name"]])
    then_events = events_of(bed, sent[then["name"]])
    deletes = [e["t"] for e in of_action(first_events, "delete") if e["result"] == "ok"]
    received_together = of_action(first_events, "receive")[0]["t"] == pytest.approx(
        of_action(then_events, "receive")[0]["t"], abs=0.05
    )
    report(
        "solo-ack",
        received_together=received_together,
        delete_after_its_end=deletes[0] - first["end"] if deletes else None,
        next_task_ended_after=then["end"] - first["end"],
    )
    assert received_together, (first_events, then_events)
    assert deletes and deletes[0] < then["end"], (first_events, then, log)
    assert bed.runs_per_task() == dict.fromkeys([s.task_id for s in sent.values()], 1)
    assert_queue_empty(bed)


#: Two tasks sent before the worker starts, so that one receive answers both: a short one
#: and one that holds the loop for long after it.
SOLO_TASKS = [("short", 0.1), ("long", 6)]
