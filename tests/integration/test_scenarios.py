"""Competing workers, ack modes, failures, shutdown, faults and bad options, for real."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time

import pytest

from tests.integration.harness import (
    REPO,
    UNDELAYED,
    Bed,
    Worker,
    assert_no_visibility_change_after_delete,
    no_copy_left,
    overlapping,
    settle,
    worker,
)

LEASE = 3


def test_two_competing_workers_run_each_task_once(bed: Bed) -> None:
    ids = [bed.send("busy", f"long-{n}", 3 * LEASE) for n in range(4)]
    options = {"visibility_timeout": LEASE}
    with (
        worker(bed, "prefork", 2, "a", options=options),
        worker(bed, "threads", 2, "b", options=options),
    ):
        done = bed.wait_for_executions(len(ids), timeout=90)
        left = no_copy_left(bed)
    assert left == {"drained": True, "receives": len(ids)}
    assert bed.runs_per_task() == dict.fromkeys(ids, 1)
    assert overlapping(done) == []


def test_early_ack_deletes_before_running_and_nothing_is_renewed_after(bed: Bed) -> None:
    ids = [bed.send("busy", f"long-{n}", 2 * LEASE) for n in range(2)]
    with worker(bed, "threads", 2, options={"visibility_timeout": LEASE}, IT_ACKS_LATE="0"):
        bed.wait_for_executions(len(ids), timeout=60)
        left = no_copy_left(bed)
    assert left == {"drained": True, "receives": len(ids)}
    assert bed.runs_per_task() == dict.fromkeys(ids, 1)
    assert_no_visibility_change_after_delete(bed)


def test_opting_out_brings_back_the_stock_redelivery(bed: Bed) -> None:
    ids = [bed.send("busy", f"long-{n}", 3 * LEASE) for n in range(2)]
    # A free slot is what picks an expired message up again, so there is one spare.
    with worker(
        bed,
        "prefork",
        3,
        options={
            "visibility_timeout": LEASE,
            "visibility_extension": False,
            "release_on_shutdown": False,
        },
    ) as process:
        bed.wait_for_executions(len(ids) + 1, timeout=60)
        log = process.log
    assert max(bed.runs_per_task().values()) > 1
    assert "Lost the SQS lease" not in log
    assert not any(
        e["action"] == "change_visibility"
        for e in bed.server.events()
        if e["queue"].endswith(bed.queue)
    )


def test_opting_out_renews_nothing_while_a_delete_is_retried(bed: Bed) -> None:
    """A CI failure of the test above: a delete retried after a failure took its lease
    into the renewal schedule, renewed it against the opt-out, and killed the renewal
    thread (``OverflowError``: it was owed a check every ``inf`` seconds).

    The deletes fail for longer than the lease: the message comes back meanwhile, and is
    deleted by its new receipt, not run again.
    """
    task_id = bed.send("busy", "quick", 0)
    options = {"visibility_timeout": LEASE, "visibility_extension": False}
    # Failing from before the receive until the message came back, however slow the
    # machine: the outage is ended by the log, not by a clock.
    bed.server.outage(300, "server_error", ["DeleteMessageBatch"])
    with worker(bed, "threads", 1, options=options) as process:
        came_back = settle(lambda: "deleted by the new receipt" in process.log, timeout=60)
        bed.server.end_outages()
        bed.wait_for_executions(1, timeout=30)
        left = no_copy_left(bed, guard=60)
        log = process.log
    assert came_back, log
    assert left["drained"], left
    assert bed.runs_per_task() == {task_id: 1}
    assert "Exception in thread" not in log, log
    assert [
        e
        for e in bed.server.events()
        if e["queue"] == bed.queue and e["action"] == "change_visibility"
    ] == []


def test_failed_task_is_released_at_once_and_dead_lettered_after_max_receives(bed: Bed) -> None:
    # With a 30 s lease, a redelivery within seconds can only come from the release.
    bed.create_queue(visibility_timeout=30, max_receive_count=3)
    task_id = bed.send("fails", "doomed", "error")
    with worker(
        bed,
        "threads",
        1,
        options={"visibility_timeout": 30, "release_on_failure": True},
        IT_ACKS_ON_FAILURE="0",
    ):
        runs = bed.wait_for_executions(3, timeout=30)
        time.sleep(2)
    assert [r["task_id"] for r in runs] == [task_id] * 3
    gaps = [later["start"] - earlier["end"] for earlier, later in itertools.pairwise(runs)]
    # Under the 30 s lease, however loaded the machine: released, not left to expire.
    assert max(gaps) < 30, gaps
    sqs = bed.sqs()
    dead_url = sqs.get_queue_url(QueueName=f"{bed.queue}-dlq")["QueueUrl"]
    moved = sqs.receive_message(QueueUrl=dead_url, WaitTimeSeconds=2).get("Messages", [])
    assert len(moved) == 1


def test_a_task_under_kombus_backoff_policy_is_left_to_that_policy_not_released(
    bed: Bed,
) -> None:
    """A predefined queue's ``backoff_tasks`` are kombu's to space out, on every kombu.

    kombu hides the rejected message for ``backoff_policy[receive count]`` seconds. If the
    transport released it as well (``release_on_failure``), it would be back at once.
    """
    url = bed.create_queue(visibility_timeout=30)
    task_id = bed.send("fails", "backed-off", "error")
    predefined = {
        bed.queue: {
            "url": url,
            "backoff_policy": {1: 6, 2: 6},
            "backoff_tasks": ["tests.integration.app.fails"],
        }
    }
    options = {"visibility_timeout": 30, "release_on_failure": True}
    options["predefined_queues"] = predefined
    with worker(bed, "threads", 1, options=options, IT_ACKS_ON_FAILURE="0"):
        runs = bed.wait_for_executions(2, timeout=30)
    assert [r["task_id"] for r in runs] == [task_id] * 2
    gap = runs[1]["start"] - runs[0]["end"]
    # No sooner than kombu's 6 s hide (less the task's own end), whatever the load; under
    # the 30 s lease: hidden by kombu's policy, not left to expire.
    assert 4 <= gap < 30, gap
    changes = [
        e["visibility"]
        for e in bed.server.events()
        if e["queue"].endswith(bed.queue) and e["action"] == "change_visibility"
    ]
    assert 6 in changes, changes
    assert 0 not in changes, changes


def test_release_delay_schedule_spaces_the_retries(bed: Bed) -> None:
    bed.create_queue(visibility_timeout=30)
    bed.send("fails", "retried", "reject")
    with worker(
        bed,
        "threads",
        1,
        options={"visibility_timeout": 30, "release_on_failure": True, "release_delay": [0, 4]},
    ):
        runs = bed.wait_for_executions(3, timeout=40)
    gaps = [later["start"] - earlier["end"] for earlier, later in itertools.pairwise(runs)]
    releases = [
        e["visibility"]
        for e in bed.server.events()
        if e["queue"] == bed.queue and e["action"] == "change_visibility"
    ]
    assert len(gaps) == 2
    # The schedule, as SQS got it: the first release at once, the second 4 s later. The
    # second run can start no sooner, whatever the load; the first may take a while.
    assert releases[:2] == [0, 4], releases
    assert 3.5 <= gaps[1] < 30, gaps


def test_warm_shutdown_finishes_running_task_and_hands_over_the_rest(bed: Bed) -> None:
    running = bed.send("busy", "running", 2 * LEASE)
    waiting = [bed.send("busy", f"waiting-{n}", 0.1) for n in range(3)]
    held = bed.send("busy", "countdown", 0.1, countdown=12, transport_options=UNDELAYED)
    options = {"visibility_timeout": 30}
    first = Worker(bed, "prefork", 1, "first", bed.env(options=options, IT_PREFETCH_MULTIPLIER=8))
    first.wait_ready()
    time.sleep(2)  # the running task has started; the rest are prefetched or held
    stopped_at = time.time()
    assert first.warm_shutdown() == 0
    with worker(bed, "threads", 4, "second", options=options):
        runs = bed.wait_for_executions(5, timeout=25)
    by_task = {r["task_id"]: r for r in runs}
    assert bed.runs_per_task() == dict.fromkeys([running, *waiting, held], 1)
    assert by_task[running]["worker"] == "first"
    for task_id in waiting:
        # Handed over well inside the 30 s lease: released, not left to expire.
        assert by_task[task_id]["worker"] == "second"
        assert by_task[task_id]["start"] - stopped_at < 20


def test_throttled_renewals_are_retried_quietly_and_lost_leases_reported(bed: Bed) -> None:
    # A lease of 3 s is renewed 1.5 s before it runs out: room for one retry at the next
    # check, not for two. One of 10 s is renewed 5 s before, room for the two throttles
    # and the success after them.
    lease = 10
    bed.server.inject_fault("ChangeMessageVisibilityBatch", "throttle", count=2)
    kept = bed.send("busy", "kept", 1.5 * lease)
    with worker(bed, "threads", 1, options={"visibility_timeout": lease}) as process:
        bed.wait_for_executions(1, timeout=40)
        bed.server.inject_fault("ChangeMessageVisibilityBatch", "server_error", count=1000)
        lost = bed.send("busy", "lost", 1.5 * lease)
        bed.wait_for_executions(2, timeout=40)
        log = process.log
    bed.server.clear_faults()
    assert f"lease of task tests.integration.app.busy[{kept}]" not in log, log
    assert bed.runs_per_task()[kept] == 1, log
    # One warning per failing streak: the throttles, then the server errors.
    assert log.count("failed, retrying while the leases hold") == 2, log
    assert f"Lost the SQS lease of task tests.integration.app.busy[{lost}]" in log
    assert "Traceback" not in log


def test_visibility_extension_max_stops_renewing_with_a_warning(bed: Bed) -> None:
    task_id = bed.send("busy", "capped", 4 * LEASE)
    with worker(
        bed, "threads", 1, options={"visibility_timeout": LEASE, "visibility_extension_max": 5}
    ) as process:
        bed.wait_for_executions(1, timeout=30)
        log = process.log
    assert f"Stopped renewing the SQS lease of task tests.integration.app.busy[{task_id}]" in log


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"visibility_timeout": 50000}, "visibility_timeout=50000: allowed range is 0 to 43200"),
        ({"visibility_extension_threshold": 40}, "visibility_extension_threshold=40.0"),
    ],
)
def test_bad_option_stops_the_worker_at_start_up(bed: Bed, options: dict, message: str) -> None:
    process = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.app", "worker", "-P", "solo"],
        cwd=REPO,
        env=bed.env(options=options),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode != 0
    assert message in process.stdout + process.stderr
