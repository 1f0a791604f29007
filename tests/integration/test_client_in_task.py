"""A task that is a client of the broker, on a threads pool, leaves its worker running.

The task is a client of the broker inside a worker: its channel, made in a pool thread,
takes the worker's event loop, as kombu's SQS channels take the process's loop when they
are made. Its blocking receive then deleted its no-ack replies through the loop's HTTP
client from the pool thread, while the loop's thread drove that client (``pycurl.error:
cannot add/remove handle - multi_perform() already running``); and the answer of a poll
the loop had sent for it reached the channel after the task had closed it, which ended
the worker (``'NoneType' object has no attribute 'polling_interval'``). A ping's
reply queue is deleted before the close, so its poll ends in an error; a queue that is
still there ends its poll with an answer: one test for each way.
"""

from __future__ import annotations

from tests.integration.harness import Bed, needs_sns_fanout, worker

LEASE = 30
PINGS = 4


@needs_sns_fanout
def test_a_task_that_pings_the_workers_leaves_its_worker_running(bed: Bed) -> None:
    bed.create_queue(visibility_timeout=LEASE)
    options = {"visibility_timeout": LEASE, "supports_fanout": True}
    sent = [bed.send("pings_the_workers", f"ping-{n}") for n in range(PINGS)]
    with worker(bed, "threads", 2, options=options) as process:
        bed.wait_for_executions(PINGS, timeout=60)
        bed.send("busy", "after", 0)
        runs = bed.wait_for_executions(PINGS + 1, timeout=30)
        still_running = process.process.poll() is None
        log = process.log
    assert still_running, log
    assert sorted(r["task_id"] for r in runs if r["name"].startswith("ping-")) == sorted(sent)
    assert all(r["outcome"] == "1 replies" for r in runs if r["name"].startswith("ping-")), runs
    assert "Unrecoverable error" not in log, log
    assert "multi_perform" not in log, log


def test_a_task_that_reads_a_queue_of_its_own_leaves_its_worker_running(bed: Bed) -> None:
    bed.create_queue(visibility_timeout=LEASE)
    sent = [bed.send("reads_a_queue_of_its_own", f"read-{n}") for n in range(PINGS)]
    with worker(bed, "threads", 2, options={"visibility_timeout": LEASE}) as process:
        bed.wait_for_executions(PINGS, timeout=60)
        bed.send("busy", "after", 0)
        runs = bed.wait_for_executions(PINGS + 1, timeout=30)
        still_running = process.process.poll() is None
        log = process.log
    assert still_running, log
    assert sorted(r["task_id"] for r in runs if r["name"].startswith("read-")) == sorted(sent)
    assert "Unrecoverable error" not in log, log
