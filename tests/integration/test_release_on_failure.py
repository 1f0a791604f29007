"""A failed task goes back to SQS at once from a prefork worker (issue 17).

Acks late, acks on failure off: Celery rejects a failed task's message without requeue,
and ``release_on_failure`` makes that reject a release, so the message is back within a
second or two, and SQS moves it to the dead-letter queue after ``maxReceiveCount``. The
lease is far longer than the test waits: a redelivery can only come from the release.

The worker is set as users leave it: Celery's prefetch multiplier (4, so the window has
room while a task runs and the worker long-polls meanwhile) and kombu's long poll (10 s).
On kombu 5.5, whose receive held the worker's event loop for a whole long poll, the
prefork pool got each task, and the main process its result, one long poll late: the
first run started 10 s after the receive, the release came later still.
"""

from __future__ import annotations

import pytest

from tests.integration.harness import Bed, worker
from tests.integration.sqs_reads import dead_lettered

#: Far longer than the test waits for a redelivery.
LEASE = 30
#: kombu's default long poll: the longer it is, the later a held loop hands tasks over.
LONG_POLL = 10
OPTIONS = {"visibility_timeout": LEASE, "release_on_failure": True, "wait_time_seconds": LONG_POLL}


@pytest.mark.parametrize("dead_letter", [False, True], ids=["no-dlq", "dlq"])
def test_a_failed_task_is_released_at_once_from_a_prefork_worker(
    bed: Bed, dead_letter: bool
) -> None:
    bed.create_queue(visibility_timeout=LEASE, max_receive_count=2 if dead_letter else None)
    task_id = bed.send("fails", "released", "error")
    with worker(
        bed,
        "prefork",
        1,
        options=OPTIONS,
        IT_ACKS_ON_FAILURE="0",
        IT_PREFETCH_MULTIPLIER=4,
    ) as process:
        # Only a failure guard, and inside the lease: the second run is the release's.
        runs = bed.wait_for_executions(2, timeout=LEASE - LONG_POLL)
        # The second failure is released too; the worker's next receive moves it.
        moved = dead_lettered(bed) if dead_letter else []
        log = process.log
    assert [r["task_id"] for r in runs] == [task_id] * 2, log
    received_at = next(
        e["t"] for e in bed.server.events() if e["queue"] == bed.queue and e["action"] == "receive"
    )
    waits = {
        "receive to first run": runs[0]["start"] - received_at,
        "first run to second": runs[1]["start"] - runs[0]["end"],
    }
    # On kombu 5.5 each took a whole long poll; here neither waits for one. Half a long
    # poll keeps the two far apart on a loaded machine too.
    assert max(waits.values()) < LONG_POLL / 2, waits
    if dead_letter:
        assert len(moved) == 1, log
        assert len(bed.executions()) == 2
