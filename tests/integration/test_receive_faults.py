"""Failed receives never end the worker; only a queue or identity that is wrong does."""

from __future__ import annotations

import re
import time

import pytest

from tests.integration.harness import (
    Bed,
    Worker,
    assert_queue_empty,
    log_has,
    needs_sns_fanout,
    no_copy_left,
    report,
    tally,
    wait_for,
    worker,
)

LEASE = 4

#: Every way a ReceiveMessage can fail that retrying fixes, several times each in a row.
TRANSIENT_FAULTS = [("server_error", 3), ("drop_connection", 3), ("throttle", 3)]


@pytest.mark.parametrize(("pool", "concurrency"), [("prefork", 2), ("solo", 1), ("gevent", 4)])
def test_failed_receives_are_retried_and_the_worker_keeps_consuming(
    bed: Bed, pool: str, concurrency: int
) -> None:
    before = bed.send("busy", "before", 0.1)
    bed.server.reset_calls()
    with worker(bed, pool, concurrency, options={"visibility_timeout": LEASE}) as process:
        bed.wait_for_executions(1, timeout=30)
        for kind, count in TRANSIENT_FAULTS:
            bed.server.inject_fault("ReceiveMessage", kind, count=count)
        wait_for(lambda: not bed.server.pending_faults(), 60)
        after = bed.send("busy", "after", 0.1)
        runs = bed.wait_for_executions(2, timeout=60)
        log = process.log
        assert process.process.poll() is None, log
    report(
        f"receive faults/{pool}",
        **tally(bed, [before, after]),
        alive=True,
        calls=bed.server.calls(),
        warnings=log.count("WARNING/"),
    )
    assert len(runs) == 2, log
    assert bed.runs_per_task() == {before: 1, after: 1}
    queue = bed.queue
    assert log.count(f"Receiving from SQS queue {queue} failed") == 1, log
    # botocore's own retries absorb some faults on the blocking path (gevent).
    assert re.search(rf"Receiving from SQS queue {queue} works again, after \d+ failed", log)
    assert "Unrecoverable error" not in log
    assert "Traceback" not in log


@pytest.mark.parametrize("pool", ["prefork", "gevent"])
def test_a_deleted_queue_stops_the_worker_with_a_message_naming_it(bed: Bed, pool: str) -> None:
    url = bed.create_queue(visibility_timeout=LEASE)
    process = Worker(bed, pool, 2, "w1", bed.env(options={"visibility_timeout": LEASE}))
    process.wait_ready()
    bed.sqs().delete_queue(QueueUrl=url)
    try:
        exit_code = process.process.wait(timeout=60)
        log = process.log
    finally:
        process.warm_shutdown()
    assert exit_code != 0, log
    assert f"Cannot receive from SQS queue {bed.queue} (" in log, log
    assert "does not exist" in log
    assert "so the worker stops" in log
    assert "Traceback" not in log


@needs_sns_fanout
def test_a_deleted_remote_control_queue_stops_its_polling_not_the_worker(bed: Bed) -> None:
    """Celery creates and deletes remote control's queues itself: not a misconfiguration."""
    bed.create_queue(visibility_timeout=LEASE)
    options = {"visibility_timeout": LEASE, "supports_fanout": True}
    with worker(bed, "prefork", 1, options=options) as process:
        sqs = bed.sqs()
        broadcast = wait_for(
            lambda: [
                url
                for url in sqs.list_queues(QueueNamePrefix="w1").get("QueueUrls", [])
                if url.endswith("-celery-pidbox")
            ],
            timeout=10,
            what="the worker's broadcast queue",
        )
        sqs.delete_queue(QueueUrl=broadcast[0])
        wait_for(lambda: "remote-control" in process.log, timeout=10, what="the warning")
        bed.send("busy", "after", 0)
        runs = bed.wait_for_executions(1, timeout=10)
        still_running = process.process.poll() is None
        log = process.log
    assert still_running, log
    assert [r["name"] for r in runs] == ["after"], log
    assert log.count("is gone (QueueDoesNotExist") + log.count("is gone (NonExistentQueue") == 1
    assert "so the worker stops" not in log
    assert "Traceback" not in log


@pytest.mark.parametrize(("pool", "concurrency"), [("prefork", 4), ("gevent", 4)])
def test_an_outage_longer_than_a_lease_loses_each_lease_once_and_runs_nothing_twice(
    bed: Bed, pool: str, concurrency: int
) -> None:
    outage = 10
    # SQS gives the long tasks' messages out again once the outage ends, while the tasks
    # still run: 20 s of margin for a loaded machine to receive them before the tasks end.
    long_ids = [bed.send("busy", f"long-{n}", 3 * outage) for n in range(2)]
    bed.server.reset_calls()
    with worker(bed, pool, concurrency, options={"visibility_timeout": LEASE}) as process:
        wait_for(lambda: log_has(process, "Task tests.integration.app.busy", 2), 30)
        time.sleep(1)
        before = bed.server.calls()
        bed.server.outage(outage, "drop_connection")
        time.sleep(outage)
        during = bed.server.calls()
        after_id = bed.send("busy", "after", 0.1)
        runs = bed.wait_for_executions(3, timeout=60)
        left = no_copy_left(bed)
        log = process.log
        assert process.process.poll() is None, log
    renewals = during.get("ChangeMessageVisibilityBatch", 0)
    renewals -= before.get("ChangeMessageVisibilityBatch", 0)
    report(
        f"outage/{pool}",
        **tally(bed, [*long_ids, after_id]),
        alive=True,
        renewal_calls_during_outage=renewals,
        calls=bed.server.calls(),
        lost_warnings=log.count("Lost the SQS lease"),
    )
    assert len(runs) == 3, log
    # All deleted: no copy can come later. (How often each was given out depends on
    # which receives the outage cut off after SQS had taken them.)
    assert left["drained"], log
    assert bed.runs_per_task() == dict.fromkeys([*long_ids, after_id], 1), log
    for task_id in long_ids:
        task = f"task tests.integration.app.busy[{task_id}]"
        assert log.count(f"Lost the SQS lease of {task}") == 1, log
        # SQS gave the message out again, to this worker: it must not run it twice.
        assert log.count(f"again while this worker still holds it ({task})") == 1, log
    # Renewals stop once the leases are lost: at most one call per check for one lease.
    assert renewals <= LEASE + 2, (before, during)
    assert "Traceback" not in log
    assert_queue_empty(bed)
