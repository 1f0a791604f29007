"""A trace started at ``apply_async`` continues in the worker, whatever SQS did meanwhile.

OpenTelemetry's Celery instrumentation puts the publish span's context (``traceparent``)
in the task message's headers; the worker's ``run/<task>`` span takes it from there as
its parent. Each scenario publishes from a producer process and runs a real prefork
worker, both instrumented (``tests/integration/tracing.py``), through one of the
transport's own paths: batched publishing, a body in S3, a countdown parked in SQS, and
a failed task released and received again. Each asserts that every run of a task is a
child of its one publish span in the same trace: ids, never timings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.harness import REPO, UNDELAYED, Bed, wait_for, worker
from tests.integration.sqs_reads import releases
from tests.integration.test_countdown_delay import send_delays
from tests.integration.test_large_payloads import LARGE, new_bucket
from tests.integration.test_large_payloads import options as large_payload_options
from tests.integration.tracing import spans

LEASE = 10
#: The parking scenarios': ETAs further away than this are parked in SQS.
PARKING_THRESHOLD = 4
#: SQS's 12-hour hold limit scaled down on a server of the module's own
#: (``short_hold_bed``), and the workers' under it, as in test_parking.py: a countdown
#: past it is parked more than once, and with a dead-letter queue sent again as a copy.
SHORT_HOLD = 12
HOLD = 8
#: Failure guard for a task's runs and their spans.
GUARD = 60
#: The release scenario's lease: far longer than it waits for the second run, which can
#: only come from the release.
RELEASE_LEASE = 30


def producer_spans(bed: Bed) -> Path:
    return bed.logs / "spans-producer.jsonl"


def worker_spans(bed: Bed) -> Path:
    return bed.logs / "spans-worker.jsonl"


def publish(bed: Bed, options: dict[str, Any], case: str, arg: object) -> list[str]:
    """Run ``tests.integration.traced_producer CASE ARG``; the task ids it published."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.traced_producer", case, str(arg)],
        cwd=REPO,
        env=bed.env(options=options, IT_TRACE_FILE=producer_spans(bed)),
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    task_ids: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return task_ids


def of_task(found: list[dict[str, Any]], operation: str, task_id: str) -> list[dict[str, Any]]:
    """The spans of one operation (``apply_async``, ``run``) that carry ``task_id``."""
    return [
        span
        for span in found
        if span["name"].startswith(f"{operation}/") and task_id in span["attributes"].values()
    ]


def wait_for_runs(bed: Bed, task_ids: list[str], runs_each: int, timeout: float = GUARD) -> None:
    def all_ended() -> bool:
        ran = spans(str(worker_spans(bed)))
        return all(len(of_task(ran, "run", task_id)) >= runs_each for task_id in task_ids)

    wait_for(all_ended, timeout, f"{runs_each} run span(s) of each of {task_ids}")


def assert_runs_are_children_of_their_publish(
    bed: Bed, task_ids: list[str], runs_each: int = 1
) -> None:
    published = spans(str(producer_spans(bed)))
    ran = spans(str(worker_spans(bed)))
    for task_id in task_ids:
        [sent] = of_task(published, "apply_async", task_id)
        runs = of_task(ran, "run", task_id)
        parents = [(run["trace_id"], run["parent_span_id"]) for run in runs]
        assert parents == [(sent["trace_id"], sent["span_id"])] * runs_each, (sent, runs)


def test_batched_publishes_each_parent_their_task_run(bed: Bed) -> None:
    options = {"visibility_timeout": LEASE}
    with worker(bed, "prefork", 2, options=options, IT_TRACE_FILE=worker_spans(bed)):
        bed.server.reset_calls()
        task_ids = publish(bed, options, "batch", 3)
        calls = bed.server.calls()
        wait_for_runs(bed, task_ids, runs_each=1)

    # One SendMessageBatch of the three: their headers travelled in one call.
    assert (calls.get("SendMessageBatch"), calls.get("SendMessage", 0)) == (1, 0), calls
    assert bed.server.batch_entries()["SendMessageBatch"] == 3
    assert_runs_are_children_of_their_publish(bed, task_ids)


def test_a_body_in_s3_parents_its_task_run(bed: Bed) -> None:
    options = large_payload_options(new_bucket(bed))
    with worker(bed, "prefork", 1, options=options, IT_TRACE_FILE=worker_spans(bed)):
        bed.server.reset_calls()
        task_ids = publish(bed, options, "large", LARGE)
        stored = bed.server.calls().get("s3:PutObject", 0)
        wait_for_runs(bed, task_ids, runs_each=1)

    assert stored == 1
    assert_runs_are_children_of_their_publish(bed, task_ids)


def test_a_countdown_delayed_in_sqs_parents_its_task_run(bed: Bed) -> None:
    options = {"visibility_timeout": LEASE}
    with worker(bed, "prefork", 1, options=options, IT_TRACE_FILE=worker_spans(bed)):
        bed.server.reset_calls()
        task_ids = publish(bed, options, "countdown", 3)
        delays = send_delays(bed)
        wait_for_runs(bed, task_ids, runs_each=1)

    actions = [e["action"] for e in bed.server.events() if e["queue"].endswith(bed.queue)]
    # Sent with DelaySeconds, received once when due: SQS held it, no worker did.
    # Whole seconds to the ETA, rounded down: 2 once the publish took a moment.
    assert len(delays) == 1 and 1 <= delays[0] <= 3, delays
    assert actions.count("receive") == 1, actions
    assert_runs_are_children_of_their_publish(bed, task_ids)


def test_a_parked_countdown_parents_its_task_run(bed: Bed) -> None:
    # Published undelayed, so that a worker receives it and parks it.
    options = {
        "visibility_timeout": LEASE,
        "eta_parking_threshold": PARKING_THRESHOLD,
        **UNDELAYED,
    }
    with worker(bed, "prefork", 1, options=options, IT_TRACE_FILE=worker_spans(bed)):
        task_ids = publish(bed, options, "countdown", 3 * PARKING_THRESHOLD)
        wait_for_runs(bed, task_ids, runs_each=1)

    actions = [e["action"] for e in bed.server.events() if e["queue"].endswith(bed.queue)]
    # Received, hidden again until near its ETA, received again: the run's message was
    # parked (renewals may follow the second receive, on a slow machine).
    assert actions[:3] == ["receive", "change_visibility", "receive"], actions
    assert actions.count("receive") == 2, actions
    assert_runs_are_children_of_their_publish(bed, task_ids)


def test_a_countdown_parked_and_copied_parents_its_task_run(short_hold_bed: Bed) -> None:
    """Received again after a park, with a dead-letter queue: the transport sends a fresh
    copy of the message instead of hiding it again, and the copy's run keeps the parent."""
    bed = short_hold_bed
    bed.create_queue(visibility_timeout=60, max_receive_count=2)
    options = {
        "visibility_timeout": PARKING_THRESHOLD,
        "visibility_extension_max": HOLD,
        "eta_parking_threshold": PARKING_THRESHOLD,
        **UNDELAYED,
    }
    with worker(bed, "prefork", 1, options=options, IT_TRACE_FILE=worker_spans(bed)) as process:
        task_ids = publish(bed, options, "countdown", 2 * HOLD + PARKING_THRESHOLD)
        wait_for_runs(bed, task_ids, runs_each=1)
        log = process.log

    assert "as a fresh copy" in log, log
    assert_runs_are_children_of_their_publish(bed, task_ids)


def test_both_runs_of_a_released_task_have_its_publish_as_parent(bed: Bed) -> None:
    bed.create_queue(visibility_timeout=RELEASE_LEASE, max_receive_count=2)
    options = {"visibility_timeout": RELEASE_LEASE, "release_on_failure": True}
    with worker(
        bed,
        "prefork",
        1,
        options=options,
        IT_TRACE_FILE=worker_spans(bed),
        IT_ACKS_ON_FAILURE="0",
    ):
        task_ids = publish(bed, options, "failing", "released")
        wait_for_runs(bed, task_ids, runs_each=2, timeout=RELEASE_LEASE - 5)

    ours = [e for e in bed.server.events() if e["queue"].endswith(bed.queue)]
    assert releases(ours), ours
    assert_runs_are_children_of_their_publish(bed, task_ids, runs_each=2)
