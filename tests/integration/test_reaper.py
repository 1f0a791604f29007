"""``celery sqs-reap`` against live and SIGKILLed workers, ``celery events`` and Flower.

Every process of the test runs under a queue name prefix of its own, so its queues and
SNS topics are apart from other tests' leftovers on the shared server.
"""

from __future__ import annotations

import signal
import time
import uuid
from typing import Any

from tests.integration.harness import Bed, needs_sns_fanout, wait_for
from tests.integration.test_monitoring import (
    LEASE,
    Process,
    _answers,
    run_celery,
    sns,
    start_worker,
    task_state,
)
from tests.ports import free_port

#: An event unread this long (beyond the monitors' 1 s poll and 1 s interval) is stale.
STALE = 8
#: ``celery sqs-reap`` as the tests run it: no queue too young, events stale after ``STALE``.
REAP = ("sqs-reap", "--older-than", "0s", "--stale", f"{STALE}s")


Row = tuple[str, str, str]


def reap(bed: Bed, options: dict[str, Any], *args: str) -> tuple[int, set[Row], dict[str, str]]:
    """Run ``celery sqs-reap``: its exit status, (action, kind, name) of each line, and
    each line's reason by name."""
    done = run_celery(bed, *REAP, "--ping-timeout", "1", *args, options=options, timeout=120)
    fields = [line.split("\t") for line in done.stdout.splitlines() if "\t" in line]
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return done.returncode, {(f[0], f[1], f[2]) for f in fields}, {f[2]: f[3] for f in fields}


def queue_names(sqs: Any, prefix: str) -> set[str]:
    urls = sqs.list_queues(QueueNamePrefix=prefix).get("QueueUrls", [])
    return {url.rsplit("/", 1)[1] for url in urls}


def subscriptions(sns: Any, prefix: str) -> dict[str, str]:
    """The subscriptions of the prefix's topics: queue name by subscription ARN."""
    return {
        s["SubscriptionArn"]: s["Endpoint"].rsplit(":", 1)[1]
        for s in sns.list_subscriptions()["Subscriptions"]
        if s["TopicArn"].rsplit(":", 1)[1].startswith(prefix)
    }


def event_queues(sns: Any, prefix: str) -> set[str]:
    return {q for q in subscriptions(sns, prefix).values() if q.startswith(f"{prefix}celeryev-")}


def start_monitor(
    bed: Bed, options: dict[str, Any], prefix: str, name: str, *args: str
) -> tuple[Process, str]:
    """``celery <args>`` started, with the event queue it subscribed."""
    before = event_queues(sns(bed), prefix)
    process = Process(bed, name, *args, options=options, FLOWER_UNAUTHENTICATED_API="true")
    wait_for(lambda: len(event_queues(sns(bed), prefix) - before) == 1, 60, f"{name}'s event queue")
    (queue,) = event_queues(sns(bed), prefix) - before
    return process, queue


def start_flower(
    bed: Bed, options: dict[str, Any], prefix: str, name: str
) -> tuple[Process, str, str]:
    """Flower started: the process, its event queue, its URL."""
    port = free_port()
    flower, queue = start_monitor(
        bed, options, prefix, name, "flower", f"--port={port}", "--address=127.0.0.1"
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(f"{url}/api/workers?refresh=1"), 60, f"{name} to serve")
    return flower, queue, url


@needs_sns_fanout
def test_the_reaper_removes_what_killed_processes_left_and_nothing_of_live_ones(bed: Bed) -> None:
    prefix = f"rp{uuid.uuid4().hex[:6]}-"
    options = {
        "visibility_timeout": LEASE,
        "supports_fanout": True,
        "events_through_sns": True,
        "queue_name_prefix": prefix,
    }
    processes: list[Process] = []
    try:
        live = start_worker(
            bed, f"live{prefix[2:8]}", "-E", "-P", "prefork", "-c", "1", options=options
        )
        processes.append(live)
        gone = start_worker(
            bed, f"gone{prefix[2:8]}", "-P", "solo", "--without-heartbeat", options=options
        )
        processes.append(gone)
        live_dump, live_dump_queue = start_monitor(
            bed, options, prefix, "events-live", "events", "--dump"
        )
        killed_dump, killed_dump_queue = start_monitor(
            bed, options, prefix, "events-killed", "events", "--dump"
        )
        live_flower, live_flower_queue, flower_url = start_flower(
            bed, options, prefix, "flower-live"
        )
        killed_flower, killed_flower_queue, _ = start_flower(bed, options, prefix, "flower-killed")
        processes += [live_dump, killed_dump, live_flower, killed_flower]
        for killed in (gone, killed_dump, killed_flower):
            killed.stop(signal.SIGKILL)
        task_queue = f"{prefix}{bed.queue}"
        gone_mailbox = next(
            q for q in queue_names(bed.sqs(), prefix) if q.startswith(f"{prefix}gone{prefix[2:8]}_")
        )
        killed_queues = {killed_dump_queue, killed_flower_queue, gone_mailbox}
        killed_subscriptions = {
            arn for arn, q in subscriptions(sns(bed), prefix).items() if q in killed_queues
        }
        live_queues = queue_names(bed.sqs(), prefix) - killed_queues
        # The live worker's heartbeats pile up, unread, in the killed monitors' queues.
        time.sleep(STALE + 4)

        found_status, found, _ = reap(bed, options)
        deleted_status, deleted, _ = reap(bed, options, "--delete")
        again_status, again, _ = reap(bed, options)
        paused_status, paused, paused_reasons = _reap_while_paused(
            bed, options, live_dump, live_dump_queue
        )

        heartbeats = live_dump.output.count("heartbeat")
        task, answers = _ping_and_run_a_task(bed, prefix, live)
        # The live monitors still receive events: a heartbeat, and the task's success.
        wait_for(lambda: live_dump.output.count("heartbeat") > heartbeats, 30, "a heartbeat")
        wait_for(lambda: task_state(flower_url, task) == "SUCCESS", 30, "the task in Flower")
        left_queues = queue_names(bed.sqs(), prefix)
        left_subscriptions = subscriptions(sns(bed), prefix)
    finally:
        for process in processes:
            process.stop(signal.SIGINT)

    expected = {
        ("event-queue", killed_dump_queue),
        ("event-queue", killed_flower_queue),
        ("mailbox", gone_mailbox),
    } | {("subscription", arn) for arn in killed_subscriptions}
    assert len(killed_subscriptions) == 3, killed_subscriptions
    assert (found_status, {(kind, name) for action, kind, name in found}) == (1, expected), found
    assert {action for action, _, _ in found} == {"would-delete"}, found
    assert (deleted_status, {(kind, name) for action, kind, name in deleted}) == (0, expected), (
        deleted
    )
    assert {action for action, _, _ in deleted} == {"deleted"}, deleted
    assert (again_status, again) == (0, set()), again
    # A monitor stopped for a moment: its events are younger than --stale, it is kept.
    assert paused_status == 0, paused
    assert {action for action, _, _ in paused} == {"kept"}, paused
    assert paused_reasons[live_dump_queue].startswith("its oldest event is "), paused_reasons
    assert left_queues & killed_queues == set(), left_queues
    assert live_queues <= left_queues, live_queues - left_queues
    assert {task_queue, live_dump_queue, live_flower_queue} <= left_queues, left_queues
    assert set(left_subscriptions) & killed_subscriptions == set(), left_subscriptions
    nodes = [node.split("@")[0] for reply in answers for node in reply]
    assert nodes == [f"live{prefix[2:8]}"], answers


def _ping_and_run_a_task(bed: Bed, prefix: str, live: Process) -> tuple[str, list[Any]]:
    """A task the live worker ran after the reaping, and its answer to a ping."""
    options = {"supports_fanout": True, "queue_name_prefix": prefix, "wait_time_seconds": 1}
    task = bed.send("busy", "after-reap", 0.1, transport_options=options)
    done = bed.wait_for_executions(1, 60)
    assert [record["task_id"] for record in done] == [task], live.output
    with (
        bed.client_app("pinger", transport_options=options) as app,
        app.connection_for_write() as connection,
    ):
        return task, list(app.control.ping(timeout=5, connection=connection) or [])


def _reap_while_paused(
    bed: Bed, options: dict[str, Any], monitor: Process, queue: str
) -> tuple[int, set[Row], dict[str, str]]:
    """A dry run, with ``--show-kept``, while ``monitor`` is stopped (SIGSTOP) and events
    wait in its queue: seconds old, younger than ``--stale``. It goes on afterwards."""
    sqs = bed.sqs()
    url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]

    def waiting() -> int:
        attributes = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"])

    monitor.process.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: waiting() > 0, 30, "an event waiting in the stopped monitor's queue")
        return reap(bed, options, "--stale", "60s", "--show-kept")
    finally:
        monitor.process.send_signal(signal.SIGCONT)
