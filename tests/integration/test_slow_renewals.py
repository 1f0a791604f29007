"""A slow SQS must not make leases lapse: renewal calls that take 2 s each, for real.

Thirty tasks run at once on a short lease, so every renewal round needs three
ChangeMessageVisibilityBatch calls. Sent one after another at 2 s each, the third would
leave 4 s after its leases came due, with a 4 s margin: past their expiry, and the strict
server would hand those tasks to the next receive. Sent concurrently, all three land
with time to spare.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer
from tests.integration.harness import (
    Bed,
    no_copy_left,
    overlapping,
    report,
    tally,
    wait_out_copies,
    worker,
)

pytestmark = pytest.mark.integration

#: Seconds of lease; the adaptive margin is at most half of it, 4 s.
LEASE = 8
#: Each renewal call is answered this much later.
LATENCY = 2.0
TASKS = 30
#: Each task outlives three leases.
TASK_SECONDS = 3 * LEASE


@pytest.fixture
def slow_renewals(sqs_server: StrictSQSServer) -> Iterator[None]:
    sqs_server.add_latency(LATENCY, actions=["ChangeMessageVisibilityBatch"])
    try:
        yield
    finally:
        sqs_server.clear_faults()


@pytest.mark.usefixtures("slow_renewals")
def test_thirty_long_tasks_keep_their_leases_when_every_renewal_takes_2_s(bed: Bed) -> None:
    bed.create_queue(visibility_timeout=LEASE)
    sent = [bed.send("busy", f"slow-{n}", TASK_SECONDS) for n in range(TASKS)]
    with worker(bed, "threads", TASKS, options={"visibility_timeout": LEASE}) as process:
        done = bed.wait_for_executions(TASKS, timeout=TASK_SECONDS + 60)
        # No copy can come once the queue is drained; one received before may still run.
        drained = no_copy_left(bed)["drained"]
        wait_out_copies(bed, TASKS, TASK_SECONDS)
        log = process.log
    events = [event for event in bed.server.events() if event["queue"].endswith(bed.queue)]
    renewals = [event for event in events if event["action"] == "change_visibility"]
    deleted_at = {
        event["message_id"]: event["t"]
        for event in events
        if event["action"] == "delete" and event["result"] == "ok"
    }
    # A renewal may land just after its message's delete: the expected end of that race.
    refused = [
        event
        for event in renewals
        if event["result"] != "ok" and deleted_at.get(event["message_id"], event["t"]) > event["t"]
    ]
    counts = tally(bed, sent)
    report("slow renewals", **counts, renewal_entries=len(renewals), refused=refused)

    assert drained
    assert counts == {"sent": TASKS, "executed": TASKS, "duplicates": 0, "lost": 0}
    assert bed.runs_per_task() == dict.fromkeys(sent, 1)
    assert overlapping(done) == []
    assert "Lost the SQS lease" not in log
    # Every task was renewed at least twice, and SQS took every renewal before the delete.
    assert len(renewals) >= 2 * TASKS
    assert refused == []
