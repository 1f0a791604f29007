"""Publishing in SendMessageBatch calls inside ``publishing_in_batches()`` (issue 27).

A producer (this test process, or one of its own that the test kills) publishes inside a
scope; the strict server counts the calls and their entries, and a real ``celery worker``
runs what SQS holds, each task's run in its record. What each test shows fails without
the scope: every publish is then a ``SendMessage`` of its own.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import pytest
from botocore.exceptions import ClientError
from celery import Celery, chord, group

from celery_sqs_heartbeat import PublishingFailed, publishing_in_batches
from celery_sqs_heartbeat.aws.clients import MAX_PUBLISH_CALLS_IN_FLIGHT
from celery_sqs_heartbeat.aws.sqs_facts import SQS_BATCH_SIZE
from tests.integration.harness import REPO, Bed, report, tally, wait_for, worker
from tests.integration.test_fifo import fifo_queue, in_order_one_at_a_time, queue_counts
from tests.integration.test_large_payloads import LARGE, new_bucket, objects

LEASE = 10
#: A 215 kB body once kombu base64-encodes it twice: under the S3 threshold, six past 1 MiB.
MEDIUM = 120_000
#: A body of some 278 kB once kombu base64-encodes it twice: past a 256 KiB queue's limit.
OVER_256_KIB = 155_000
KIB = 1024
BUSY = "tests.integration.app.busy"
SIZED = "tests.integration.app.sized"


def producer(bed: Bed, **options: Any) -> Celery:
    """The test's own producer: this transport, the bed's server and queue."""
    app = Celery("batch-producer", set_as_current=False)
    app.conf.update(
        broker_url=bed.server.broker_url,
        broker_transport="celery_sqs_heartbeat:Transport",
        broker_transport_options={"region": "us-east-1", "is_secure": False, **options},
        task_default_queue=bed.queue,
    )
    return app


def task_ids_in_queue(bed: Bed) -> list[str]:
    """The task id of every message in the bed's queue, read as a receive; hidden after."""
    sqs = bed.sqs()
    url = sqs.get_queue_url(QueueName=bed.queue)["QueueUrl"]
    found: list[str] = []
    while True:
        answer = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60, WaitTimeSeconds=0
        )
        messages = answer.get("Messages") or []
        if not messages:
            return found
        for message in messages:
            found.append(json.loads(base64.b64decode(message["Body"]))["headers"]["id"])


def send_batches(bed: Bed) -> tuple[int, int]:
    """SendMessageBatch calls and their entries since the last reset; no SendMessage."""
    calls = bed.server.calls()
    assert calls.get("SendMessage", 0) == 0, calls
    return calls.get("SendMessageBatch", 0), bed.server.batch_entries().get("SendMessageBatch", 0)


def assert_batched(calls: int, entries: int) -> None:
    """The calls carried several messages each, on average: they were batches.

    How full each call is depends on the machine: a message waits 50 ms for company
    (``BATCH_WAIT``), and a producer slowed by a loaded machine sends emptier calls. The
    packing itself is the unit tests' (``tests/unit/publishing/test_book.py``).
    """
    assert 0 < calls <= entries / 2, (calls, entries)


def test_a_loop_a_group_and_another_thread_publish_in_full_calls_each_task_runs_once(
    bed: Bed,
) -> None:
    bed.create_queue(visibility_timeout=LEASE)
    app = producer(bed)
    bed.server.reset_calls()
    from_thread: list[str] = []

    def publish_elsewhere() -> None:
        # A scope is its own thread's: another thread opens one of its own.
        with publishing_in_batches():
            from_thread.extend(
                app.send_task(BUSY, args=(f"thread{n}", 0)).id for n in range(SQS_BATCH_SIZE)
            )

    with publishing_in_batches():
        looped = [app.send_task(BUSY, args=(f"loop{n}", 0)).id for n in range(15)]
        grouped = group(app.signature(BUSY, args=(f"group{n}", 0)) for n in range(15))
        group_ids = [result.id for result in grouped.apply_async().results]
        other = threading.Thread(target=publish_elsewhere)
        other.start()
        other.join()
    # At the scope's end, before any worker: SQS holds every message.
    in_sqs = queue_counts(bed)
    calls, entries = send_batches(bed)
    sent = [*looped, *group_ids, *from_thread]
    with worker(bed, "threads", 4, options={"visibility_timeout": LEASE}):
        bed.wait_for_executions(len(sent), timeout=30)
        time.sleep(1)
    counts = tally(bed, sent)
    report("batch publishing", calls=calls, entries=entries, **counts)
    assert in_sqs["ApproximateNumberOfMessages"] == str(len(sent)) == "40"
    assert entries == 40
    assert_batched(calls, entries)
    assert counts == {"sent": 40, "executed": 40, "duplicates": 0, "lost": 0}


def test_a_chord_s_header_goes_out_in_full_calls(bed: Bed) -> None:
    """Celery publishes a chord's header as it does a group, from ``chord.run``: inside a
    scope, in SendMessageBatch calls. Only the header is published here; the body waits
    for the header's results, which a worker would count in the result backend."""
    bed.create_queue(visibility_timeout=LEASE)
    app = producer(bed)
    # A backend that takes chords, in this process only: nothing here runs the tasks.
    app.conf.result_backend = "cache+memory://"
    header = [app.signature(BUSY, args=(f"header{n}", 0)) for n in range(15)]
    bed.server.reset_calls()
    with publishing_in_batches():
        result = chord(header)(app.signature(BUSY, args=("body", 0)))
    header_ids = [child.id for child in result.parent.results]
    calls, entries = send_batches(bed)
    in_sqs = task_ids_in_queue(bed)
    report("chord header batch publishing", calls=calls, entries=entries, in_sqs=len(in_sqs))
    assert sorted(in_sqs) == sorted(header_ids)
    assert entries == 15
    assert_batched(calls, entries)


def test_a_fifo_queue_keeps_each_group_s_order_with_several_messages_a_call(bed: Bed) -> None:
    fifo_queue(bed, LEASE)
    app = producer(bed)
    labels = {name: [f"{name}{n}" for n in range(12)] for name in "AB"}
    bed.server.reset_calls()
    with publishing_in_batches():
        for a_label, b_label in zip(labels["A"], labels["B"], strict=True):
            app.send_task(BUSY, args=(a_label, 0), MessageGroupId="A")
            app.send_task(BUSY, args=(b_label, 0), MessageGroupId="B")
    calls, entries = send_batches(bed)
    with worker(bed, "solo", 1, options={"visibility_timeout": LEASE}):
        runs = bed.wait_for_executions(24, timeout=30)
    problems = {
        name: in_order_one_at_a_time(runs, group_labels) for name, group_labels in labels.items()
    }
    report("fifo batch publishing", calls=calls, entries=entries, problems=problems)
    assert entries == 24
    assert_batched(calls, entries)
    assert problems == {"A": [], "B": []}
    assert all(count == 1 for count in bed.runs_per_task().values())


def test_large_bodies_go_to_s3_first_and_the_rest_are_packed_under_a_megabyte_a_call(
    bed: Bed,
) -> None:
    """Six 215 kB bodies stay in SQS and need two calls by size (moto refuses a call over
    1 MiB whole, which would raise here); two bodies over SQS's limit go to S3 first."""
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    options = {"large_payload_bucket": bucket, "visibility_timeout": LEASE}
    app = producer(bed, **options)
    bed.server.reset_calls()
    with publishing_in_batches():
        medium = [app.send_task(SIZED, args=(f"medium{n}", "m" * MEDIUM)).id for n in range(6)]
        large = [app.send_task(SIZED, args=(f"large{n}", "x" * LARGE)).id for n in range(2)]
    puts = bed.server.calls().get("s3:PutObject", 0)
    calls, entries = send_batches(bed)
    assert len(objects(bed, bucket)) == 2
    with worker(bed, "threads", 4, options=options):
        runs = bed.wait_for_executions(8, timeout=30)
    report("s3 batch publishing", puts=puts, calls=calls, entries=entries)
    assert (puts, entries) == (2, 8)
    # Six 215 kB bodies cannot share one call of 1 MiB.
    assert calls >= 2, calls
    assert_batched(calls, entries)
    outcomes = {run["task_id"]: run["outcome"] for run in runs}
    assert outcomes == {
        **dict.fromkeys(medium, f"ok:{MEDIUM}"),
        **dict.fromkeys(large, f"ok:{LARGE}"),
    }


def test_a_predefined_queue_is_published_to_with_its_own_url_and_client(bed: Bed) -> None:
    """kombu's ``_put`` picks the predefined queue's URL and its client (its own keys);
    the scope's calls use both: no queue is listed, looked up or created."""
    url = bed.create_queue(visibility_timeout=LEASE)
    predefined = {
        "visibility_timeout": LEASE,
        "predefined_queues": {
            bed.queue: {"url": url, "access_key_id": "queue-key", "secret_access_key": "x"}
        },
    }
    app = producer(bed, **predefined)
    bed.server.reset_calls()
    with publishing_in_batches():
        sent = [app.send_task(BUSY, args=(f"t{n}", 0)).id for n in range(12)]
    calls = bed.server.calls()
    entries = bed.server.batch_entries().get("SendMessageBatch", 0)
    with worker(bed, "threads", 4, options=predefined):
        bed.wait_for_executions(len(sent), timeout=30)
    report("predefined queue", calls=calls)
    # kombu's declare asks for the queue's count (GetQueueAttributes), by the URL too.
    assert entries == 12
    assert_batched(calls["SendMessageBatch"], entries)
    assert not {"ListQueues", "GetQueueUrl", "CreateQueue", "SendMessage"} & set(calls), calls
    assert tally(bed, sent) == {"sent": 12, "executed": 12, "duplicates": 0, "lost": 0}


def test_failed_entries_and_a_throttled_call_are_sent_again_and_each_task_runs_once(
    bed: Bed,
) -> None:
    bed.create_queue(visibility_timeout=LEASE)
    app = producer(bed)
    bed.server.reset_calls()
    bed.server.inject_fault("SendMessageBatch", "throttle", count=1)
    bed.server.fail_entries("SendMessageBatch", "InternalError", count=3)
    with publishing_in_batches():
        sent = [app.send_task(BUSY, args=(f"t{n}", 0)).id for n in range(20)]
    calls, entries = send_batches(bed)
    with worker(bed, "threads", 4, options={"visibility_timeout": LEASE}):
        bed.wait_for_executions(len(sent), timeout=30)
        time.sleep(1)
    counts = tally(bed, sent)
    report("batch publishing retries", calls=calls, entries=entries, **counts)
    # 20 entries, the throttled call's again, and the 3 failed entries again.
    assert entries >= 20 + 3 and calls >= 2 + 2, (calls, entries)
    assert counts == {"sent": 20, "executed": 20, "duplicates": 0, "lost": 0}
    assert bed.server.pending_faults() == []


def test_entries_sqs_refuses_are_named_in_one_exception_and_nothing_else_is_missing(
    bed: Bed,
) -> None:
    bed.create_queue(visibility_timeout=LEASE)
    app = producer(bed)
    bed.server.fail_entries("SendMessageBatch", "InvalidMessageContents", count=2)
    sent: list[str] = []
    with pytest.raises(PublishingFailed) as failed, publishing_in_batches():
        sent.extend(app.send_task(BUSY, args=(f"t{n}", 0)).id for n in range(12))
    held = task_ids_in_queue(bed)
    refused = failed.value.task_ids
    report("refused entries", refused=refused, message=str(failed.value))
    assert len(refused) == 2 and set(refused) <= set(sent)
    assert all("InvalidMessageContents" in failed.value.reasons[task] for task in refused)
    assert sorted(held) == sorted(set(sent) - set(refused))


def test_a_producer_killed_in_a_scope_leaves_what_sqs_confirmed_and_at_most_the_calls_in_flight(
    bed: Bed,
) -> None:
    """What SQS holds after a SIGKILL: every task the producer recorded as confirmed, and
    besides those only tasks of calls on the wire at the kill (SQS may have taken a call
    whose answer the producer never read): at most a call of ten per sending thread."""
    bed.create_queue(visibility_timeout=LEASE)
    confirmed_file = bed.logs / "confirmed.txt"
    bed.server.add_latency(0.3, ["SendMessageBatch"])
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.batch_producer", str(confirmed_file), "400"],
            cwd=REPO,
            env=bed.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

        def confirmed() -> list[str]:
            return confirmed_file.read_text().split() if confirmed_file.exists() else []

        wait_for(lambda: len(confirmed()) >= 100, timeout=30, what="100 confirmed tasks")
        process.kill()
        output, _ = process.communicate(timeout=10)
    finally:
        bed.server.clear_faults()
    recorded = set(confirmed())
    # A call the server was still answering lands in SQS meanwhile; then read.
    time.sleep(0.5)
    held = task_ids_in_queue(bed)
    unconfirmed = set(held) - recorded
    report("killed producer", confirmed=len(recorded), held=len(held), unconfirmed=len(unconfirmed))
    assert "all confirmed" not in output, "the producer ended before the kill"
    assert len(held) == len(set(held)), Counter(held).most_common(3)
    assert recorded <= set(held)
    assert len(unconfirmed) <= MAX_PUBLISH_CALLS_IN_FLIGHT * SQS_BATCH_SIZE


def queue_with_limit(bed: Bed, maximum_message_size: int) -> None:
    """The bed's queue, created up front with a lower ``MaximumMessageSize`` than SQS's 1 MiB."""
    bed.sqs().create_queue(
        QueueName=bed.queue,
        Attributes={
            "VisibilityTimeout": str(LEASE),
            "MaximumMessageSize": str(maximum_message_size),
        },
    )


def test_a_publish_on_a_thread_without_a_scope_is_its_own_while_another_thread_has_one(
    bed: Bed,
) -> None:
    """Issue 31, 2: thread B, with no scope, publishes a message SQS refuses (too long for
    the queue) while thread A has a scope open. B's ``send_task`` raises SQS's refusal, as
    outside any scope; A's scope, which published nothing, has nothing to report."""
    queue_with_limit(bed, KIB)
    app = producer(bed)
    opened, published = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def scope_on_another_thread() -> None:
        try:
            with publishing_in_batches():
                opened.set()
                published.wait(30)
        except PublishingFailed as failed:
            outcome["scope"] = failed.task_ids
        else:
            outcome["scope"] = []

    other = threading.Thread(target=scope_on_another_thread)
    other.start()
    assert opened.wait(30)
    bed.server.reset_calls()
    try:
        app.send_task(SIZED, args=("too long", "x" * KIB))
    except ClientError as refused:
        outcome["publish"] = refused.response["Error"]["Code"]
    else:
        outcome["publish"] = "returned"
    finally:
        published.set()
    other.join(60)
    calls = bed.server.calls()
    report("publish beside another thread's scope", calls=calls, **outcome)
    assert outcome == {"publish": "InvalidParameterValue", "scope": []}
    assert calls.get("SendMessage") == 1 and "SendMessageBatch" not in calls, calls
    assert task_ids_in_queue(bed) == []


def test_one_message_over_the_queue_s_size_is_refused_alone_and_the_nine_others_are_taken(
    bed: Bed,
) -> None:
    """Issue 31, 5: nine small tasks and one of some 278 kB, in a scope, to a queue that
    takes 256 KiB a message: only the large one is named, and the nine are in SQS."""
    queue_with_limit(bed, 256 * KIB)
    app = producer(bed)
    small: list[str] = []
    large: list[str] = []
    with pytest.raises(PublishingFailed) as failed, publishing_in_batches():
        small.extend(app.send_task(BUSY, args=(f"small{n}", 0)).id for n in range(4))
        large.append(app.send_task(SIZED, args=("large", "x" * OVER_256_KIB)).id)
        small.extend(app.send_task(BUSY, args=(f"small{n}", 0)).id for n in range(4, 9))
    held = task_ids_in_queue(bed)
    report("one message over the queue's size", refused=failed.value.reasons, held=len(held))
    assert failed.value.task_ids == large
    assert "InvalidParameterValue" in failed.value.reasons[large[0]]
    assert sorted(held) == sorted(small)
