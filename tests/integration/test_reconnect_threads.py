"""A reconnect in a threads pool: prefetched tasks the pool was handed run once (issue 24, item 1).

Celery's threads pool queues every request it is handed in its executor, and its
``flush()`` at a lost connection drops none of them: they run after the reconnect, and
ack through the closed channel. The transport released every message whose task had not
started, so SQS handed those out again and they ran twice.
"""

from __future__ import annotations

from tests.integration.harness import Bed, assert_queue_empty, worker

LEASE = 3


def test_a_reconnect_runs_the_tasks_queued_in_a_threads_pool_once(bed: Bed) -> None:
    running = [bed.send("busy", f"running-{n}", 4 * LEASE) for n in range(2)]
    queued = [bed.send("busy", f"queued-{n}", 0.1) for n in range(2)]
    with worker(
        bed,
        "threads",
        2,
        options={"visibility_timeout": LEASE},
        IT_PREFETCH_MULTIPLIER=2,
        IT_DROP_CONNECTION_AFTER=LEASE,
    ) as process:
        bed.wait_for_executions(4, timeout=90)
        # A second run of a queued task would come once its released copy is received.
        bed.wait_for_executions(5, timeout=2 * LEASE + 2)
        log = process.log
        assert process.process.poll() is None, log
    assert "Connection to broker lost" in log, log
    assert bed.runs_per_task() == dict.fromkeys([*running, *queued], 1), log
    assert "Lost the SQS lease" not in log, log
    assert_queue_empty(bed)
