"""Every pool kind keeps long, prefetched and countdown tasks to one execution each."""

from __future__ import annotations

import pytest

from tests.integration.harness import (
    UNDELAYED,
    Bed,
    assert_no_visibility_change_after_delete,
    no_copy_left,
    overlapping,
    wait_out_copies,
    worker,
)

LEASE = 3


@pytest.mark.parametrize(
    ("pool", "concurrency"), [("prefork", 2), ("threads", 2), ("solo", 1), ("gevent", 4)]
)
def test_every_task_runs_once_when_tasks_outlive_the_lease(
    bed: Bed, pool: str, concurrency: int
) -> None:
    # Three leases long; with prefetch 2 per process, some wait behind the running ones,
    # and the countdown task is held in memory past a whole lease before it starts.
    long_ids = [bed.send("busy", f"long-{n}", 3 * LEASE) for n in range(concurrency + 2)]
    eta_id = bed.send("busy", "eta", 0.5, countdown=LEASE + 2, transport_options=UNDELAYED)
    with worker(
        bed,
        pool,
        concurrency,
        options={"visibility_timeout": LEASE},
        IT_PREFETCH_MULTIPLIER=2,
    ) as process:
        done = bed.wait_for_executions(len(long_ids) + 1, timeout=120)
        # No copy can come once the queue is drained; one received before may still run.
        drained = no_copy_left(bed)["drained"]
        wait_out_copies(bed, len(long_ids) + 1, 3 * LEASE)
        log = process.log
    assert drained, log
    assert bed.runs_per_task() == dict.fromkeys([*long_ids, eta_id], 1), log
    assert overlapping(done) == []
    assert "Lost the SQS lease" not in log
    assert "Traceback" not in log
    assert_no_visibility_change_after_delete(bed)


def test_stock_kombu_transport_redelivers_the_same_workload(bed: Bed) -> None:
    """The measurement the package exists for: without renewals, long tasks run twice."""
    bed.create_queue(visibility_timeout=LEASE)
    long_ids = [bed.send("busy", f"long-{n}", 3 * LEASE) for n in range(2)]
    with worker(
        bed,
        "prefork",
        3,  # a spare slot is what picks an expired message up again
        options={"visibility_timeout": LEASE},
        IT_TRANSPORT="sqs",
    ):
        bed.wait_for_executions(len(long_ids) + 1, timeout=60)
    assert max(bed.runs_per_task().values()) > 1
