"""Task messages of any size: bodies over SQS's limit go through S3 (issue 19).

Real ``celery worker`` processes against the strict server, which serves S3 beside SQS.
A task's 1.1 MB argument makes a body SQS refuses; with ``large_payload_bucket`` set it
goes to S3, SQS carries the pointer, and the worker reads it back, runs the task once,
and deletes the object once SQS confirmed the message's delete.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid
from typing import Any

import boto3
import pytest
from celery import Celery, chain

from tests.integration.harness import REPO, Bed, assert_queue_empty, no_copy_left, settle, worker
from tests.integration.sqs_reads import dead_lettered

#: Over SQS's 1 MiB once kombu base64-encodes it.
LARGE = 1_100_000
LEASE = 10


def s3(bed: Bed) -> Any:
    return boto3.client("s3", config=bed.server.s3_config, **bed.server.boto3_kwargs)


def new_bucket(bed: Bed) -> str:
    name = f"it-{uuid.uuid4().hex[:12]}"
    s3(bed).create_bucket(Bucket=name)
    return name


def objects(bed: Bed, bucket: str) -> list[str]:
    listed = s3(bed).list_objects_v2(Bucket=bucket).get("Contents") or []
    return [entry["Key"] for entry in listed]


def options(bucket: str, **more: Any) -> dict[str, Any]:
    return {
        "visibility_timeout": LEASE,
        "large_payload_bucket": bucket,
        "large_payload_prefix": "tasks/",
        **more,
    }


def test_a_large_body_goes_through_s3_and_a_small_one_is_sent_as_before(bed: Bed) -> None:
    bucket = new_bucket(bed)
    url = bed.create_queue(visibility_timeout=LEASE)
    bed.send("sized", "large", "x" * LARGE, transport_options=options(bucket))
    bed.send("sized", "small", "x" * 1000, transport_options=options(bucket))
    received = bed.sqs().receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    pointers = [m for m in received if m["Body"].startswith("[")]
    plain = [m for m in received if not m["Body"].startswith("[")]
    assert len(pointers) == 1 and len(plain) == 1
    pointer_class, where = json.loads(pointers[0]["Body"])
    assert pointer_class == "software.amazon.payloadoffloading.PayloadS3Pointer"
    assert where["s3BucketName"] == bucket and where["s3Key"].startswith("tasks/")
    size = pointers[0]["MessageAttributes"]["ExtendedPayloadSize"]
    stored = s3(bed).get_object(Bucket=bucket, Key=where["s3Key"])["Body"].read()
    assert size == {"DataType": "Number", "StringValue": str(len(stored))}
    assert len(stored) > 1_048_576
    # The small one: kombu's own base64 body, no attribute added.
    assert "MessageAttributes" not in plain[0]


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo", "gevent"])
def test_an_offloaded_task_runs_once_and_its_object_goes_after_the_delete(
    bed: Bed, pool: str
) -> None:
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    bed.send("sized", "large", "x" * LARGE, transport_options=options(bucket))
    bed.send("sized", "small", "y" * 1000, transport_options=options(bucket))
    assert len(objects(bed, bucket)) == 1
    with worker(bed, pool, 2, options=options(bucket)) as process:
        done = bed.wait_for_executions(2, timeout=20)
        gone = settle(lambda: not objects(bed, bucket))
        log = process.log
    assert sorted(r["outcome"] for r in done) == ["ok:1000", f"ok:{LARGE}"], log
    assert all(count == 1 for count in bed.runs_per_task().values())
    assert gone, objects(bed, bucket)
    assert_queue_empty(bed)


def test_a_retry_publishes_the_large_argument_through_s3_again(bed: Bed) -> None:
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    task_id = bed.send("sized", "retried", "x" * LARGE, "retry", transport_options=options(bucket))
    bed.server.reset_calls()
    with worker(bed, "threads", 2, options=options(bucket)) as process:
        done = bed.wait_for_executions(2, timeout=20)
        gone = settle(lambda: not objects(bed, bucket))
        log = process.log
    assert [(r["task_id"], r["outcome"]) for r in done] == [
        (task_id, "retrying"),
        (task_id, f"ok:{LARGE}"),
    ], log
    assert gone, objects(bed, bucket)
    # The worker published the retry, and its body went through S3 too.
    assert bed.server.calls()["s3:PutObject"] == 1


def test_a_released_and_dead_lettered_message_keeps_its_object(bed: Bed) -> None:
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE, max_receive_count=2)
    bed.send("sized", "failing", "x" * LARGE, "error", transport_options=options(bucket))
    [key] = objects(bed, bucket)
    run_options = options(bucket, release_on_failure=True)
    with worker(bed, "threads", 1, options=run_options, IT_ACKS_ON_FAILURE="0") as process:
        runs = bed.wait_for_executions(2, timeout=15)
        moved = dead_lettered(bed)
        log = process.log
    assert [r["outcome"] for r in runs] == ["failed", "failed"], log
    assert len(moved) == 1 and json.loads(moved[0]["Body"])[1]["s3Key"] == key
    assert objects(bed, bucket) == [key]


def test_keep_objects_leaves_the_object_for_a_lifecycle_rule(bed: Bed) -> None:
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    bed.send("sized", "kept", "x" * LARGE, transport_options=options(bucket))
    [key] = objects(bed, bucket)
    kept = options(bucket, large_payload_keep_objects=True)
    with worker(bed, "threads", 1, options=kept) as process:
        done = bed.wait_for_executions(1, timeout=15)
        emptied = settle(lambda: _queue_empty(bed))
        log = process.log
    assert [r["outcome"] for r in done] == [f"ok:{LARGE}"], log
    assert emptied
    assert objects(bed, bucket) == [key]


def _queue_empty(bed: Bed) -> bool:
    try:
        assert_queue_empty(bed)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("pool", ["threads", "gevent"])
def test_an_unreadable_object_releases_its_message_with_a_backoff(bed: Bed, pool: str) -> None:
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    task_id = bed.send("sized", "late", "x" * LARGE, transport_options=options(bucket))
    [key] = objects(bed, bucket)
    # Both attempts of the worker's first read fail.
    bed.server.inject_fault("s3:GetObject", "server_error", count=2)
    with worker(bed, pool, 1, options=options(bucket)) as process:
        done = bed.wait_for_executions(1, timeout=15)
        gone = settle(lambda: not objects(bed, bucket))
        log = process.log
    assert [(r["task_id"], r["outcome"]) for r in done] == [(task_id, f"ok:{LARGE}")], log
    assert log.count(f"Cannot read the body of a large message from s3://{bucket}/{key}") == 1
    assert "read from S3 again (1 reads failed)" in log
    assert "x" * 100 not in log
    assert gone
    receives = [
        e for e in bed.server.events() if e["action"] == "receive" and e["queue"] == bed.queue
    ]
    released = [
        e
        for e in bed.server.events()
        if e["action"] == "change_visibility" and e["queue"] == bed.queue and e["visibility"] == 1
    ]
    assert len(receives) == 2 and len(released) == 1, bed.server.events()


def test_s3_down_for_10_s_while_large_tasks_arrive(bed: Bed) -> None:
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    with worker(bed, "threads", 2, options=options(bucket)) as process:
        bed.server.outage(seconds=10, kind="server_error", actions=["s3:GetObject"])
        sent = [
            bed.send("sized", f"t{n}", "x" * LARGE, transport_options=options(bucket))
            for n in range(6)
        ]
        done = bed.wait_for_executions(6, timeout=40)
        gone = settle(lambda: not objects(bed, bucket))
        alive = process.process.poll() is None
        log = process.log
    assert sorted(r["task_id"] for r in done) == sorted(sent), log
    assert bed.runs_per_task() == dict.fromkeys(sent, 1)
    assert alive and gone
    assert log.count("Cannot read the body of a large message") == 1, log
    assert_queue_empty(bed)


def extended_client(bed: Bed, *args: str, stdin: str = "") -> str:
    """Run AWS's amazon-sqs-extended-client (tests/integration/extended_client.py)."""
    config = bed.logs / "aws-config"
    config.write_text("[default]\ns3 =\n    addressing_style = path\n")
    env = bed.env(AWS_ENDPOINT_URL=bed.server.endpoint_url, AWS_CONFIG_FILE=config)
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.extended_client", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
        check=True,
    )
    return done.stdout


def kombu_body(bed: Bed, data: str) -> str:
    """The SQS body kombu makes of a ``sized`` task, as sent to a scratch queue."""
    scratch = Bed(bed.server, f"{bed.queue}-scratch", bed.records, bed.logs)
    url = scratch.create_queue(visibility_timeout=LEASE)
    scratch.send("sized", "from-aws", data)
    [message] = bed.sqs().receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    return str(message["Body"])


def test_a_task_sent_through_aws_extended_client_runs_on_the_worker(bed: Bed) -> None:
    """A worker with no bucket of its own reads the buckets it is told to read."""
    bucket = new_bucket(bed)
    url = bed.create_queue(visibility_timeout=LEASE)
    # 300 kB: kombu's body fits SQS, and AWS's library offloads it (over 256 KiB).
    extended_client(bed, "send", url, bucket, stdin=kombu_body(bed, "z" * 300_000))
    assert len(objects(bed, bucket)) == 1
    reader = {"visibility_timeout": LEASE, "large_payload_read_buckets": [bucket]}
    with worker(bed, "threads", 1, options=reader) as process:
        done = bed.wait_for_executions(1, timeout=15)
        gone = settle(lambda: not objects(bed, bucket))
        log = process.log
    assert [r["outcome"] for r in done] == ["ok:300000"], log
    assert gone


def test_a_message_the_transport_offloaded_is_read_by_aws_extended_client(bed: Bed) -> None:
    bucket = new_bucket(bed)
    url = bed.create_queue(visibility_timeout=LEASE)
    task_id = bed.send("sized", "to-aws", "x" * LARGE, transport_options=options(bucket))
    body = extended_client(bed, "receive", url)
    message = json.loads(base64.b64decode(body))
    assert message["headers"]["id"] == task_id
    args = json.loads(base64.b64decode(message["body"]))[0]
    assert args == ["to-aws", "x" * LARGE]


def test_two_workers_run_each_offloaded_task_once(bed: Bed) -> None:
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    sent = [
        bed.send("sized", f"t{n}", "x" * LARGE, transport_options=options(bucket)) for n in range(6)
    ]
    run_options = options(bucket)
    with (
        worker(bed, "prefork", 2, name="w1", options=run_options) as first,
        worker(bed, "threads", 2, name="w2", options=run_options) as second,
    ):
        done = bed.wait_for_executions(6, timeout=30)
        gone = settle(lambda: not objects(bed, bucket))
        logs = first.log + second.log
    assert sorted(r["task_id"] for r in done) == sorted(sent), logs
    assert bed.runs_per_task() == dict.fromkeys(sent, 1)
    assert gone
    assert_queue_empty(bed)


def test_the_lease_covers_a_slow_read_and_the_worker_goes_on_meanwhile(bed: Bed) -> None:
    """A read longer than two leases: renewed meanwhile, not run twice, nothing held up."""
    lease = 3
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=lease)
    large = bed.send("sized", "large", "x" * LARGE, transport_options=options(bucket))
    bed.server.reset_calls()
    bed.server.inject_fault("s3:GetObject", "delay", seconds=2.5 * lease)
    run_options = options(bucket, visibility_timeout=lease)
    with worker(bed, "threads", 2, options=run_options) as process:
        settle(lambda: bed.server.calls().get("s3:GetObject", 0) > 0)
        small = bed.send("sized", "small", "y" * 1000, transport_options=options(bucket))
        sent = time.time()
        done = bed.wait_for_executions(2, timeout=20)
        log = process.log
    by_task = {r["task_id"]: r for r in done}
    assert set(by_task) == {large, small}, log
    [read] = [c for c in bed.server.call_log() if c["action"] == "s3:GetObject"]
    events = [e for e in bed.server.events() if e["queue"] == bed.queue]
    # Sent while the read was held, and run before it was answered.
    assert sent < read["answered"] and by_task[small]["end"] < read["answered"], (sent, read, log)
    assert bed.runs_per_task() == {large: 1, small: 1}
    assert [e["action"] for e in events].count("receive") == 2, events
    renewals = [
        e for e in events if e["action"] == "change_visibility" and e["visibility"] == lease
    ]
    assert len(renewals) >= 2, events


def test_a_message_being_read_at_shutdown_goes_back_at_once(bed: Bed) -> None:
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    task_id = bed.send("sized", "read-at-stop", "x" * LARGE, transport_options=options(bucket))
    bed.server.inject_fault("s3:GetObject", "delay", seconds=6)
    run_options = options(bucket, visibility_timeout=30)
    with worker(bed, "threads", 1, name="stopping", options=run_options) as first:
        settle(lambda: bed.server.calls().get("s3:GetObject", 0) > 0)
        first.warm_shutdown()
        first_log = first.log_path.read_text()
    # Far sooner than the 30 s lease: only a release at shutdown makes it visible now.
    with worker(bed, "threads", 1, name="next", options=run_options) as second:
        done = bed.wait_for_executions(1, timeout=10)
        second_log = second.log
    assert [(r["task_id"], r["worker"]) for r in done] == [(task_id, "next")], (
        first_log + second_log
    )


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo", "gevent"])
def test_the_object_of_a_task_ending_in_a_warm_shutdown_goes_before_the_worker_exits(
    bed: Bed, pool: str
) -> None:
    """Found by the chaos soak: a gevent worker told to stop ran its last task, its
    message's delete was confirmed as the worker closed, and it ended before the thread
    that deletes the objects of deleted messages had deleted this one."""
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    task_id = bed.send("busy", "last", 2, "x" * LARGE, transport_options=options(bucket))
    starts = bed.logs / "starts.jsonl"
    with worker(bed, pool, 1, options=options(bucket), IT_START_FILE=starts) as process:
        # Running, not only received: a prefork worker stopping before a child reported
        # the job's start hangs on Celery 5.5 (AsynPool's flush) and never acks it on any.
        assert settle(lambda: starts.exists() and task_id in starts.read_text()), process.log
        process.warm_shutdown()
        log = process.log_path.read_text()
    assert bed.runs_per_task() == {task_id: 1}, log
    assert objects(bed, bucket) == [], log
    assert_queue_empty(bed)


def test_a_chain_of_large_tasks_goes_through_s3_at_every_link(bed: Bed) -> None:
    """The chain's first message carries the second task's argument too; the worker
    publishes the second link itself."""
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    with Celery("producer", set_as_current=False) as app:
        app.conf.update(
            broker_url=bed.server.broker_url,
            broker_transport="celery_sqs_heartbeat:Transport",
            broker_transport_options={"region": "us-east-1", "is_secure": False, **options(bucket)},
        )
        name = "tests.integration.app.sized"
        links = [
            app.signature(name, args=(f"link{n}", "x" * LARGE), immutable=True) for n in (1, 2)
        ]
        chain(*links).apply_async(queue=bed.queue)
    bed.server.reset_calls()
    with worker(bed, "threads", 1, options=options(bucket)) as process:
        done = bed.wait_for_executions(2, timeout=20)
        gone = settle(lambda: not objects(bed, bucket))
        log = process.log
    assert [(r["name"], r["outcome"]) for r in done] == [
        ("link1", f"ok:{LARGE}"),
        ("link2", f"ok:{LARGE}"),
    ], log
    assert bed.server.calls()["s3:PutObject"] == 1  # the second link, by the worker
    assert gone


@pytest.mark.parametrize("when", ["acked", "running"])
def test_a_message_received_again_keeps_its_object_until_the_new_receipts_delete(
    bed: Bed, when: str
) -> None:
    """Found by the chaos soak (issue 33): SQS hands a message out again once its lease
    lapsed (every renewal failing), to the worker that acked it or still runs it. The
    delete goes by the new receipt, and the object, remembered for the old one, was
    never deleted."""
    bucket = new_bucket(bed)
    lease = 3
    bed.create_queue(visibility_timeout=lease)
    small = options(bucket, visibility_timeout=lease, large_payload_threshold=1024)
    seconds = 0.1 if when == "acked" else 4 * lease
    task_id = bed.send("busy", when, seconds, "x" * 5000, transport_options=small)
    lapsing = ["ChangeMessageVisibilityBatch"]
    if when == "acked":
        lapsing.append("DeleteMessageBatch")
    seen_again = (
        "after this worker acked it" if when == "acked" else "while this worker still holds it"
    )
    # Failing from before the receive until the message came back to its worker, however
    # slow the machine: the outage is ended by the log, not by a clock.
    bed.server.outage(300, "server_error", lapsing)
    with worker(bed, "threads", 2, options=small) as process:
        came_back = settle(lambda: seen_again in process.log, timeout=60)
        bed.server.end_outages()
        bed.wait_for_executions(1, timeout=30)
        left = no_copy_left(bed, guard=60)
        gone = settle(lambda: not objects(bed, bucket))
        log = process.log
    assert came_back, log  # the message did come back to its worker
    assert left["drained"], left
    assert bed.runs_per_task() == {task_id: 1}, log
    assert gone, objects(bed, bucket)
