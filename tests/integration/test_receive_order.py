"""The receive's steps meet: a body through S3 with a far countdown (issue 24, item 3).

Parking read a task's ETA from the body SQS delivered, before the body was read from S3.
For a task whose arguments went through S3 that body is the pointer, which carries no
ETA: the task was held and renewed instead of parked, and past SQS's 12 hours it would
run twice. The hold limit is scaled down as in ``test_parking``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer
from tests.integration.harness import UNDELAYED, new_bed, report
from tests.integration.test_large_payloads import LARGE, new_bucket
from tests.integration.test_parking import HOLD, OPTIONS, SHORT_HOLD
from tests.integration.test_worker_stops import start


@pytest.fixture(scope="module")
def short_hold() -> Iterator[StrictSQSServer]:
    with StrictSQSServer(max_hold_seconds=SHORT_HOLD) as server:
        yield server


def test_a_far_countdown_whose_body_went_through_s3_is_parked_not_held(
    short_hold: StrictSQSServer, tmp_path: Path
) -> None:
    bed = new_bed(short_hold, tmp_path)
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=60)
    large = {"large_payload_bucket": bucket, **UNDELAYED}
    with ExitStack() as stack:
        process = start(stack, bed, "threads", 2, "a", options={**OPTIONS, **large})
        process.wait_ready()
        delay = 2 * HOLD + 4
        eta = datetime.now(timezone.utc) + timedelta(seconds=delay)
        task_id = bed.send("sized", "far", "x" * LARGE, eta=eta, transport_options=large)
        bed.wait_for_executions(1, timeout=delay + 30)
        # A second run would come one hold later at most.
        bed.wait_for_executions(2, timeout=HOLD)
        log = process.log
    parks = log.count("Parking task tests.integration.app.sized")
    report("receive-order/s3-countdown", runs=bed.runs_per_task(), parks=parks)
    assert bed.runs_per_task() == {task_id: 1}, log
    assert [r["outcome"] for r in bed.executions()] == [f"ok:{LARGE}"]
    # Hidden again at every receive before its ETA: at least twice over two holds.
    assert parks >= 2, log
    assert "Lost the SQS lease" not in log and "Traceback" not in log, log
