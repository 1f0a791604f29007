"""FIFO queues in real workers: renewal, a group's order, release, shutdown, deduplication.

A Celery producer reaches SQS's FIFO parameters through message properties: options that
``apply_async`` / ``send_task`` does not know become properties, and kombu's ``_put``
sends ``MessageGroupId`` and ``MessageDeduplicationId`` from them (``"default"`` and a
random UUID when they are missing). Every count here comes from the tasks' own records
and from the strict SQS server's per-message event log.

Each scenario was checked to fail without the behaviour it claims: the docstrings say
how. ``IT_TRANSPORT=sqs`` in pytest's environment runs every worker of this file on
kombu's stock SQS transport (the harness passes the environment through); the producer
is unchanged.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from contextlib import ExitStack
from typing import Any

from tests.integration.harness import (
    Bed,
    Sent,
    Worker,
    no_copy_left,
    overlapping,
    report,
    send_recorded,
    settle,
    tally,
    wait_for,
    wait_out_copies,
    worker,
)
from tests.integration.sqs_reads import releases

#: The lease of the renewal scenarios; their tasks run longer than it.
LEASE = 3
#: The lease of the release scenarios, long so that "released" and "expired" differ.
LONG_LEASE = 10
#: Only a failure guard on how soon a released message is received again: a poll turn,
#: which a loaded machine stretches. That it was released, not left to its lease, the
#: event log shows (each release confirmed, and the receive after it).
HANDOVER_SECONDS = LONG_LEASE
BUSY = "tests.integration.app.busy"
#: The beds' ``wait_time_seconds``: a release at shutdown may hide a message this long.
POLL = 1


def fifo_queue(bed: Bed, visibility_timeout: int, **attributes: str) -> str:
    """Make the bed's queue a FIFO queue, created up front with these attributes."""
    bed.queue = f"{bed.queue}.fifo"
    created = bed.sqs().create_queue(
        QueueName=bed.queue,
        Attributes={
            "FifoQueue": "true",
            "VisibilityTimeout": str(visibility_timeout),
            **attributes,
        },
    )
    return str(created["QueueUrl"])


def send(
    bed: Bed, task: str, *args: Any, group: str, keep_dedup_id: bool = True, **options: Any
) -> Sent:
    """Publish as ``task.apply_async(args, MessageGroupId=group, **options)`` does.

    ``keep_dedup_id=False`` takes kombu's random ``MessageDeduplicationId`` out of the
    SendMessage, as a producer that leaves deduplication to the queue's content would
    send it; kombu itself always sends one.
    """

    def drop_dedup_id(params: dict[str, Any]) -> None:
        params.pop("MessageDeduplicationId", None)

    keep = keep_dedup_id or "MessageDeduplicationId" in options
    edit = None if keep else drop_dedup_id
    return send_recorded(bed, task, *args, edit_params=edit, MessageGroupId=group, **options)


def events_of(bed: Bed, task: Sent, action: str | None = None) -> list[dict[str, Any]]:
    return [
        dict(e)
        for e in bed.server.events()
        if e["message_id"] == task.message_id and action in (None, e["action"])
    ]


def renewals(events: list[dict[str, Any]], lease: int) -> list[dict[str, Any]]:
    return [e for e in events if e["action"] == "change_visibility" and e["visibility"] == lease]


def deleted(bed: Bed, *tasks: Sent) -> bool:
    return all(any(e["result"] == "ok" for e in events_of(bed, task, "delete")) for task in tasks)


def queue_counts(bed: Bed, queue: str | None = None) -> dict[str, str]:
    sqs = bed.sqs()
    url = sqs.get_queue_url(QueueName=queue or bed.queue)["QueueUrl"]
    counts: dict[str, str] = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return counts


EMPTY = {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}


def by_label(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {run["name"]: run for run in runs}


def in_order_one_at_a_time(runs: list[dict[str, Any]], labels: list[str]) -> list[str]:
    """What breaks a group's order in ``runs``: a run out of send order, or two at once."""
    found = sorted((run for run in runs if run["name"] in labels), key=lambda run: run["start"])
    problems = []
    if [run["name"] for run in found] != labels:
        problems.append(f"started in the order {[run['name'] for run in found]}, sent {labels}")
    for earlier, later in itertools.pairwise(found):
        if later["start"] < earlier["end"]:
            problems.append(
                f"{later['name']} started {earlier['end'] - later['start']:.2f} s "
                f"before {earlier['name']} ended"
            )
    return problems


def spans_overlap(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> bool:
    return any(a["start"] < b["end"] and b["start"] < a["end"] for a in first for b in second)


# ---------------------------------------------------------------------------------------
# 1. Renewal
# ---------------------------------------------------------------------------------------


def test_long_tasks_on_a_fifo_queue_run_once_with_their_leases_renewed(bed: Bed) -> None:
    """Two groups' tasks of three leases each, on a worker with a spare pool slot.

    Checked to fail: with ``IT_TRANSPORT=sqs`` (kombu's stock transport) the first lease
    runs out mid-task, SQS unblocks the group and the spare slot runs the same message
    again; with ``visibility_extension: False`` the same.
    """
    fifo_queue(bed, LEASE)
    tasks = [send(bed, "busy", f"{group}-long", 3 * LEASE, group=group) for group in "AB"]
    calls_before = bed.server.calls()
    # Three slots for two groups: the spare one polls all along, and would take a
    # message whose lease ran out.
    with worker(bed, "prefork", 3, options={"visibility_timeout": LEASE}) as process:
        runs = bed.wait_for_executions(len(tasks), timeout=60)
        # Anything redelivered would show as a second receive (asserted below), and
        # nothing can be once each message is deleted and the queue empty.
        all_deleted = settle(lambda: deleted(bed, *tasks))
        log = process.log
    batch = "ChangeMessageVisibilityBatch"
    renewal_calls = bed.server.calls().get(batch, 0) - calls_before.get(batch, 0)
    events = {task.task_id: events_of(bed, task) for task in tasks}
    report(
        "fifo renewal",
        **tally(bed, [task.task_id for task in tasks]),
        renewals=[len(renewals(e, LEASE)) for e in events.values()],
        change_visibility_batch_calls=renewal_calls,
    )
    assert bed.runs_per_task() == {task.task_id: 1 for task in tasks}, log
    assert overlapping(runs) == []
    # The groups do not wait for each other: both ran at once.
    assert spans_overlap([runs[0]], [runs[1]]), runs
    assert all_deleted, events
    for seen in events.values():
        assert [e["action"] for e in seen if e["action"] != "change_visibility"] == [
            "receive",
            "delete",
        ], seen
        # A renewal out while the delete landed is refused, as it should be; none before.
        deleted_at = next(e["t"] for e in seen if e["action"] == "delete")
        assert all(e["result"] == "ok" for e in seen if e["t"] <= deleted_at), seen
        # Nine seconds on a three-second lease: renewed again and again.
        assert len(renewals(seen, LEASE)) >= 3, seen
    assert renewal_calls >= 3, renewal_calls
    assert queue_counts(bed) == EMPTY
    assert "Lost the SQS lease" not in log
    assert "Traceback" not in log


# ---------------------------------------------------------------------------------------
# 2. A group's order
# ---------------------------------------------------------------------------------------


def test_a_group_s_tasks_run_one_at_a_time_in_send_order(bed: Bed) -> None:
    """Two groups of three tasks longer than the lease, on two prefork processes.

    The six messages wait in the queue when the worker starts. Asked for two, SQS would
    answer A0 and A1 (as many of one group as it can), and two pool processes would run
    them at once: the transport receives one message at a time from a FIFO queue, so
    SQS's group lock hands out A1 only after A0 is deleted.

    Checked to fail: with ``IT_TRANSPORT=sqs`` a task runs twice; with the transport
    asking for as many messages as kombu wants (``_receive_size`` returning ``wanted``),
    A0 and A1 ran side by side.
    """
    fifo_queue(bed, LEASE)
    labels = {group: [f"{group}{n}" for n in range(3)] for group in "AB"}
    tasks = [
        send(bed, "busy", label, LEASE + 1, group=group)
        for group, group_labels in labels.items()
        for label in group_labels
    ]
    with worker(bed, "prefork", 2, options={"visibility_timeout": LEASE}) as process:
        runs = bed.wait_for_executions(len(tasks), timeout=90)
        left = no_copy_left(bed)
        log = process.log
    start = min(run["start"] for run in runs)
    problems = {
        group: in_order_one_at_a_time(runs, group_labels) for group, group_labels in labels.items()
    }
    report(
        "fifo order",
        **tally(bed, [task.task_id for task in tasks]),
        timeline=[
            (run["name"], round(run["start"] - start, 2), round(run["end"] - start, 2))
            for run in sorted(runs, key=lambda run: run["start"])
        ],
        problems=problems,
    )
    assert left == {"drained": True, "receives": len(tasks)}, log
    assert bed.runs_per_task() == {task.task_id: 1 for task in tasks}, log
    group_runs = {
        group: [run for run in runs if run["name"] in group_labels]
        for group, group_labels in labels.items()
    }
    assert spans_overlap(group_runs["A"], group_runs["B"]), runs
    assert problems == {"A": [], "B": []}, log


# ---------------------------------------------------------------------------------------
# 3. Release on failure, and the dead-letter queue
# ---------------------------------------------------------------------------------------

#: The dead-letter queue's maxReceiveCount: the failing task runs this many times.
MAX_RECEIVES = 2


def test_a_failed_task_comes_back_before_the_rest_of_its_group_then_is_dead_lettered(
    bed: Bed,
) -> None:
    """A failing task first in its group, released on failure, with a FIFO dead-letter queue.

    Checked to fail: with ``release_on_failure: False`` (the option's default), or with
    ``IT_TRANSPORT=sqs``, the rejected message is left to its 10 s lease, so the failing
    task's second run comes far later than ``HANDOVER_SECONDS`` and no release is seen.
    """
    sqs = bed.sqs()
    dead_url = sqs.create_queue(
        QueueName=f"{bed.queue}-dlq.fifo", Attributes={"FifoQueue": "true"}
    )["QueueUrl"]
    dead_arn = sqs.get_queue_attributes(QueueUrl=dead_url, AttributeNames=["QueueArn"])
    fifo_queue(
        bed,
        LONG_LEASE,
        RedrivePolicy=json.dumps(
            {
                "deadLetterTargetArn": dead_arn["Attributes"]["QueueArn"],
                "maxReceiveCount": str(MAX_RECEIVES),
            }
        ),
    )
    doomed = send(bed, "fails", "A0", "error", group="A")
    rest = [send(bed, "busy", f"A{n}", 0.2, group="A") for n in (1, 2)]
    with worker(
        bed,
        "threads",
        1,
        options={"visibility_timeout": LONG_LEASE, "release_on_failure": True},
        IT_ACKS_ON_FAILURE="0",  # a failed task is rejected, not acked
    ) as process:
        runs = bed.wait_for_executions(MAX_RECEIVES + len(rest), timeout=40)
        all_deleted = settle(lambda: deleted(bed, *rest))
        drained = no_copy_left(bed)["drained"]
        runs = wait_out_copies(bed, MAX_RECEIVES + len(rest), 0.2)
        log = process.log
    runs.sort(key=lambda run: run["start"])
    failed = runs[:MAX_RECEIVES]
    gaps = [later["start"] - earlier["end"] for earlier, later in itertools.pairwise(failed)]
    doomed_events = events_of(bed, doomed)
    released = releases(doomed_events, up_to=POLL)
    answer = sqs.receive_message(QueueUrl=dead_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    moved = answer.get("Messages", [])
    report(
        "fifo release",
        runs=[(run["name"], run["outcome"]) for run in runs],
        gaps=[round(gap, 2) for gap in gaps],
        releases=len(released),
        dead_lettered=len(moved),
    )
    # The failing task again and again before the rest of its group, then the rest in order.
    assert [run["name"] for run in runs] == ["A0"] * MAX_RECEIVES + ["A1", "A2"], log
    assert [run["outcome"] for run in runs] == ["failed"] * MAX_RECEIVES + ["ok", "ok"]
    assert drained, log
    assert in_order_one_at_a_time(runs, ["A1", "A2"]) == []
    assert all_deleted
    # Released, not left to its 10 s lease.
    assert max(gaps) < HANDOVER_SECONDS, gaps
    assert [e["result"] for e in released] == ["ok"] * MAX_RECEIVES, doomed_events
    assert len([e for e in doomed_events if e["action"] == "receive"]) == MAX_RECEIVES
    # The group waited for it: the next message was received only after its last release.
    assert events_of(bed, rest[0], "receive")[0]["t"] > released[-1]["t"]
    assert [message["MessageId"] for message in moved] == [doomed.message_id]
    assert bed.runs_per_task()[rest[0].task_id] == bed.runs_per_task()[rest[1].task_id] == 1
    assert queue_counts(bed) == EMPTY
    assert "Lost the SQS lease" not in log


# ---------------------------------------------------------------------------------------
# 4. Warm shutdown
# ---------------------------------------------------------------------------------------

#: The lease of the shutdown scenario; the running task lasts two and a half of them.
SHUTDOWN_LEASE = 4


def test_warm_shutdown_finishes_the_running_task_and_hands_its_group_over_in_order(
    bed: Bed,
) -> None:
    """Worker "first" runs A0 and holds B0, C0 and D0 prefetched; A1 waits behind A0.

    "first" receives one message at a time, so it holds the head of each other group but
    never A1 while A0 is in flight. At its warm shutdown A0 finishes and is deleted, the
    held heads are released, and "second" (started after the prefetch) runs them, and
    A1 once A0 is deleted.

    Checked to fail: with ``IT_TRANSPORT=sqs``, A0's lease runs out while it runs and
    "second" runs it again; with ``release_on_shutdown: False``, B0-D0 are not released
    but left to their leases.
    """
    fifo_queue(bed, SHUTDOWN_LEASE)
    running = send(bed, "busy", "A0", 2.5 * SHUTDOWN_LEASE, group="A")
    follower = send(bed, "busy", "A1", 0.5, group="A")
    held = [send(bed, "busy", f"{group}0", 0.5, group=group) for group in "BCD"]
    everything = [running, follower, *held]
    options = {"visibility_timeout": SHUTDOWN_LEASE}
    with ExitStack() as stack:
        first = Worker(
            bed, "prefork", 1, "first", bed.env(options=options, IT_PREFETCH_MULTIPLIER=8)
        )
        stack.callback(first.warm_shutdown, 30)
        first.wait_ready()
        prefetched = [running, *held]
        wait_for(
            lambda: all(f"{BUSY}[{task.task_id}] received" in first.log for task in prefetched),
            30,
            "the prefetch",
        )
        # Started only now, so that the held messages are first's.
        second = Worker(bed, "threads", 1, "second", bed.env(options=options))
        stack.callback(second.warm_shutdown, 30)
        second.wait_ready()
        received_at = events_of(bed, running, "receive")[0]["t"]
        # Stopped once the running task has outlived its first lease.
        wait_for(lambda: time.time() > received_at + SHUTDOWN_LEASE + 1, 30, "a lease to pass")
        assert bed.executions() == [], "the running task ended before the shutdown"
        first.kill(signal.SIGTERM)
        stopped_at = time.time()
        first_exit = first.process.wait(30)
        runs = bed.wait_for_executions(len(everything), timeout=30)
        all_deleted = settle(lambda: deleted(bed, *everything))
        drained = no_copy_left(bed)["drained"]
        runs = wait_out_copies(bed, len(everything), 2.5 * SHUTDOWN_LEASE)
        first_log, second_log = first.log, second.log
    by_name = by_label(runs)
    events = {task.task_id: events_of(bed, task) for task in everything}
    running_events = events[running.task_id]
    running_deletes = [e for e in running_events if e["action"] == "delete"]

    def receives(task: Sent) -> list[dict[str, Any]]:
        return [e for e in events[task.task_id] if e["action"] == "receive"]

    report(
        "fifo warm shutdown",
        **tally(bed, [task.task_id for task in everything]),
        first_exit=first_exit,
        workers={run["name"]: run["worker"] for run in runs},
        running_renewals=len(renewals(running_events, SHUTDOWN_LEASE)),
        running_deleted_after=[round(e["t"] - stopped_at, 2) for e in running_deletes],
        back_after_release=[
            round(receives(task)[-1]["t"] - releases(events[task.task_id], up_to=POLL)[0]["t"], 2)
            if releases(events[task.task_id], up_to=POLL) and len(receives(task)) > 1
            else None
            for task in held
        ],
    )
    assert first_exit == 0, first_log
    assert drained, first_log + second_log
    assert bed.runs_per_task() == {task.task_id: 1 for task in everything}, first_log + second_log
    assert by_name["A0"]["worker"] == "first"
    assert [by_name[name]["worker"] for name in ("A1", "B0", "C0", "D0")] == ["second"] * 4
    assert all_deleted, events
    # The running task kept its lease past the shutdown, and its message was deleted.
    assert len(renewals(running_events, SHUTDOWN_LEASE)) >= 2, running_events
    assert releases(running_events, up_to=POLL) == []
    [running_deleted] = running_deletes
    assert [e["action"] for e in running_events][-1] == "delete"
    assert running_deleted["result"] == "ok" and running_deleted["t"] > stopped_at
    for task in held:
        seen = events[task.task_id]
        # Held by "first" (renewed while A0 ran), released at its shutdown, taken by "second".
        assert renewals(seen, SHUTDOWN_LEASE), seen
        [release] = releases(seen, up_to=POLL)
        assert release["result"] == "ok", seen
        before, after = receives(task)
        assert before["t"] < stopped_at < release["t"] < after["t"], seen
        assert [e["action"] for e in seen][-1] == "delete", seen
    # "second" runs one task at a time, A1 and the released heads: each head waits for the
    # ones it took before. The first waits for a poll's turn, and A1 at most.
    handovers = sorted(
        receives(task)[-1]["t"] - releases(events[task.task_id], up_to=POLL)[0]["t"]
        for task in held
    )
    assert handovers[0] <= HANDOVER_SECONDS, handovers
    # A1 was never handed out while A0 was in flight: received once, by "second", after
    # A0's delete; so group A ran in send order across the two workers.
    [follower_receive] = receives(follower)
    assert follower_receive["t"] > running_deleted["t"], events[follower.task_id]
    assert in_order_one_at_a_time(runs, ["A0", "A1"]) == []
    assert queue_counts(bed) == EMPTY
    assert "Traceback" not in first_log + second_log


# ---------------------------------------------------------------------------------------
# 5. Deduplication
# ---------------------------------------------------------------------------------------


def run_until_deleted(
    bed: Bed, delivered: list[Sent]
) -> tuple[list[dict[str, Any]], bool, dict[str, str], str]:
    """Run the queue on three prefork processes until ``delivered`` are deleted.

    Returns the runs, whether every one was deleted, the queue's counts right then
    (nothing may wait behind them: no copy, no repeat; a copy received before its delete
    would be a second receive, which the callers look for) and the worker's log.
    """
    with worker(bed, "prefork", 3, options={"visibility_timeout": LEASE}) as process:
        bed.wait_for_executions(len(delivered), timeout=60)
        all_deleted = settle(lambda: deleted(bed, *delivered))
        left = queue_counts(bed)
        return bed.executions(), all_deleted, left, process.log


def test_content_based_deduplication_runs_a_body_sent_twice_once(bed: Bed) -> None:
    """The same SendMessage twice, without a deduplication id, on a content-deduplicating queue.

    kombu always sends a ``MessageDeduplicationId`` (a random one unless the producer
    gives one), which overrides the queue's content-based deduplication; so the producer
    here sends without it, as one relying on the queue would, and then sends the very
    same body again with boto3, as a producer retrying a send it believes failed.

    Checked to fail: sending the copy with a deduplication id of its own (so that SQS
    takes it for a new message), it is delivered and the task runs twice; with
    ``IT_TRANSPORT=sqs``, the tasks outlive their lease and the spare pool slot runs
    them again.
    """
    fifo_queue(bed, LEASE, ContentBasedDeduplication="true")
    same = send(bed, "busy", "A-same", 2 * LEASE, group="A", keep_dedup_id=False)
    assert "MessageDeduplicationId" not in same.params, same.params
    bed.sqs().send_message(**same.params)
    other = send(bed, "busy", "B-other", 2 * LEASE, group="B", keep_dedup_id=False)
    delivered = [same, other]
    runs, all_deleted, left, log = run_until_deleted(bed, delivered)
    report(
        "fifo content-based dedup",
        **tally(bed, [task.task_id for task in delivered]),
        left_after_deletes=left,
    )
    assert bed.runs_per_task() == {same.task_id: 1, other.task_id: 1}, log
    assert overlapping(runs) == []
    assert all_deleted
    assert left == EMPTY, left
    for task in delivered:
        assert len(events_of(bed, task, "receive")) == 1


def test_explicit_deduplication_ids_from_the_producer_drop_the_repeat(bed: Bed) -> None:
    """``apply_async(..., MessageDeduplicationId=...)``: a repeat of an id is dropped.

    Checked to fail: sending the repeat with another id (or without one, which makes
    kombu send a random one), it is delivered and runs; with ``IT_TRANSPORT=sqs``, the
    tasks outlive their lease and the spare slot runs them again.
    """
    fifo_queue(bed, LEASE)
    first = send(bed, "busy", "A-first", 2 * LEASE, group="A", MessageDeduplicationId="order-42")
    repeat = send(bed, "busy", "A-repeat", 2 * LEASE, group="A", MessageDeduplicationId="order-42")
    distinct = send(
        bed, "busy", "B-distinct", 2 * LEASE, group="B", MessageDeduplicationId="order-43"
    )
    assert first.params["MessageDeduplicationId"] == repeat.params["MessageDeduplicationId"]
    assert first.params["MessageGroupId"] == "A"
    delivered = [first, distinct]
    runs, all_deleted, left, log = run_until_deleted(bed, delivered)
    report(
        "fifo explicit dedup",
        **tally(bed, [task.task_id for task in delivered]),
        repeat_ran=repeat.task_id in bed.runs_per_task(),
        left_after_deletes=left,
    )
    assert bed.runs_per_task() == {first.task_id: 1, distinct.task_id: 1}, log
    assert overlapping(runs) == []
    assert all_deleted
    assert left == EMPTY, left
    for task in delivered:
        assert len(events_of(bed, task, "receive")) == 1
