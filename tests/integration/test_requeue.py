"""A task that requeues its message runs again at once, and knows it is a redelivery.

Celery marks a message's second delivery with ``delivery_info["redelivered"]``, and a
task that requeues its first delivery (Celery's own suite has one) relies on it. kombu's
SQS transport never set it, so such a task requeued every delivery, for ever. SQS counts
the receives; the transport now says a message received before is redelivered. The lease
is far longer than the test waits: the redelivery can only come from the release.
"""

from __future__ import annotations

from tests.integration.harness import Bed, assert_queue_empty, settle, worker

LEASE = 30


def test_a_requeued_task_comes_back_at_once_marked_redelivered(bed: Bed) -> None:
    bed.create_queue(visibility_timeout=LEASE)
    task_id = bed.send("requeued_once", "requeued")
    with worker(bed, "prefork", 1, options={"visibility_timeout": LEASE}) as process:
        # Only a failure guard: the redelivery comes at once, the lease's a lot later.
        bed.wait_for_executions(2, timeout=LEASE / 2)
        # A third run would mean the redelivery was taken for a first delivery again.
        settle(lambda: len(bed.executions()) > 2, timeout=3)
        log = process.log
    runs = bed.executions()
    assert [(r["task_id"], r["outcome"]) for r in runs] == [
        (task_id, "requeued"),
        (task_id, "ok"),
    ], log
    # Released at once (visible again at the change), and received again before the first
    # receive's lease could have run out: the redelivery is the release's.
    events = [e for e in bed.server.events() if e["queue"] == bed.queue]
    first, again = [e["t"] for e in events if e["action"] == "receive"]
    assert [e["visibility"] for e in events if e["action"] == "change_visibility"] == [0], events
    assert again < first + LEASE, events
    assert_queue_empty(bed)
