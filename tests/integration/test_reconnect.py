"""Celery's consumer restarts its broker connection while acks-late tasks run."""

from __future__ import annotations

import collections

import celery
import pytest

from tests.integration.harness import Bed, assert_queue_empty, records, worker

LEASE = 3


@pytest.mark.xfail(
    celery.VERSION < (5, 6),
    reason="Celery 5.5 never acks the tasks that were running at a reconnect (seen: their "
    "Request.acknowledge is never called), so their messages stay held until the worker "
    "stops, then run again; Celery 5.6 acks them",
    strict=True,
)
def test_a_reconnect_keeps_running_leases_and_releases_the_waiting_messages_once(
    bed: Bed,
) -> None:
    running = [bed.send("busy", f"running-{n}", 4 * LEASE) for n in range(2)]
    waiting = [bed.send("busy", f"waiting-{n}", 0.1) for n in range(2)]
    with worker(
        bed,
        "prefork",
        2,
        options={"visibility_timeout": LEASE},
        IT_PREFETCH_MULTIPLIER=2,
        IT_DROP_CONNECTION_AFTER=LEASE,
    ) as process:
        bed.wait_for_executions(4, timeout=90)
        bed.wait_for_executions(5, timeout=LEASE + 2)
        log = process.log
        assert process.process.poll() is None, log
    assert "Connection to broker lost" in log, log
    assert bed.runs_per_task() == dict.fromkeys([*running, *waiting], 1), log
    assert "Lost the SQS lease" not in log, log
    assert "Couldn't ack" not in log, log
    receives = collections.Counter(
        event["message_id"]
        for event in bed.server.events()
        if event["queue"].endswith(bed.queue) and event["action"] == "receive"
    )
    # The running messages were received once; the waiting ones were released at the
    # reconnect and received again (at most once more).
    assert sorted(receives.values()) in ([1, 1, 1, 1], [1, 1, 1, 2], [1, 1, 2, 2]), receives
    # Celery 5.5 and 5.6 log the dropped connection's own traceback with their warning.
    tracebacks = [
        record
        for record in records(log)
        if "Traceback" in record and "Connection to broker lost" not in record
    ]
    assert not tracebacks, log
    assert_queue_empty(bed)
