"""The least IAM policies of docs/iam.md, proven by real workers on a server that enforces IAM.

The policies are read from docs/iam.md as published, so that the documents users copy are
the ones that ran here. moto evaluates fewer policy features than AWS (see
``StrictSQSServer.enforce_iam``), but none that these policies use.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from celery_sqs_heartbeat.testing import Refusal, StrictSQSServer
from tests.integration.harness import (
    Bed,
    Worker,
    broker_url,
    create_queue,
    needs_sns_fanout,
    settle,
    wait_for,
)
from tests.integration.iam import Iam, Keys, allow, client, published_policy, without_action
from tests.integration.sqs_reads import dead_letter_count
from tests.integration.test_monitoring import OPTIONS, events_dump, monitored_worker, run_celery

LEASE = 3


@dataclass(frozen=True)
class Enforced:
    """A server that enforces IAM, and the keys of the users made on it beforehand."""

    server: StrictSQSServer
    producer: Keys
    worker: Keys
    worker_without_renewals: Keys
    producer_without_listing: Keys
    worker_without_listing: Keys
    monitored_worker: Keys
    """The worker's policy and the monitoring policy."""
    monitor: Keys
    """``celery events``, ``celery inspect``: the monitoring policy alone."""
    monitor_without_subscribing: Keys
    ops: Keys
    """Stands for the infrastructure code that creates queues; allowed all of SQS."""

    def sqs(self, keys: Keys) -> Any:
        return client(self.server, "sqs", keys, retries=False)

    def refused(self, *keys: Keys) -> list[Refusal]:
        ids = {access_key_id for access_key_id, _ in keys}
        return [r for r in self.server.refused_calls() if r["access_key_id"] in ids]

    def new_bed(self, tmp_path: Path, name: str, max_receive_count: int | None = None) -> Bed:
        """A queue under the policies' ``celery*`` prefix, made by ops before any worker runs."""
        bed = Bed(
            server=self.server,
            queue=f"celery-it-{uuid.uuid4().hex[:8]}",
            records=tmp_path / f"executions-{name}.jsonl",
            logs=tmp_path,
        )
        create_queue(self.sqs(self.ops), bed.queue, 30, max_receive_count)
        return bed


def iam_setup(iam: Iam) -> Enforced:
    """The users of this module, made before the ``enforced`` fixture enforces IAM."""
    worker_policy = published_policy("worker")
    producer_policy = published_policy("producer")
    monitoring_policy = published_policy("monitoring")
    return Enforced(
        server=iam.server,
        producer=iam.user("producer", producer_policy),
        worker=iam.user("worker", worker_policy),
        worker_without_renewals=iam.user(
            "worker-without-renewals",
            without_action(worker_policy, "sqs:ChangeMessageVisibility"),
        ),
        producer_without_listing=iam.user(
            "producer-without-listing", without_action(producer_policy, "sqs:ListQueues")
        ),
        worker_without_listing=iam.user(
            "worker-without-listing", without_action(worker_policy, "sqs:ListQueues")
        ),
        monitored_worker=iam.user("monitored-worker", worker_policy, monitoring_policy),
        monitor=iam.user("monitor", monitoring_policy),
        monitor_without_subscribing=iam.user(
            "monitor-without-subscribing", without_action(monitoring_policy, "sns:Subscribe")
        ),
        ops=iam.user("ops", allow("sqs:*", "*")),
    )


def worker_env(enforced: Enforced, keys: Keys) -> dict[str, str]:
    """The worker's credentials, in the broker URL as a user passes them, and in the env."""
    return {
        "IT_BROKER_URL": broker_url(enforced.server, *keys),
        "AWS_ACCESS_KEY_ID": keys[0],
        "AWS_SECRET_ACCESS_KEY": keys[1],
    }


@contextmanager
def workers(*specs: tuple[Bed, str, int, str, dict[str, str]]) -> Iterator[list[Worker]]:
    """Start the workers together and wait for all, then stop them all warmly."""
    with ExitStack() as stack:
        started = []
        for bed, pool, concurrency, name, env in specs:
            process = Worker(bed, pool, concurrency, name, env)
            stack.callback(process.warm_shutdown)
            started.append(process)
        for process in started:
            process.wait_ready()
        yield started


def assert_no_secret_in(logs: list[str], enforced: Enforced) -> None:
    """The harness checks its own secret key; these workers ran with IAM users' keys."""
    for keys in (
        enforced.producer,
        enforced.worker,
        enforced.worker_without_renewals,
        enforced.producer_without_listing,
        enforced.worker_without_listing,
        enforced.monitored_worker,
        enforced.monitor,
        enforced.monitor_without_subscribing,
    ):
        for log in logs:
            assert keys[1] not in log


def test_the_readme_policies_run_long_and_failing_tasks_with_nothing_refused(
    enforced: Enforced, tmp_path: Path
) -> None:
    # One queue per failure path: this package's release, and kombu's reject, which reads
    # the redrive policy and leaves the message for the dead-letter queue. Both move a
    # failed message there after one receive, so a second execution would be a bug.
    releasing = enforced.new_bed(tmp_path, "releasing", max_receive_count=1)
    rejecting = enforced.new_bed(tmp_path, "rejecting", max_receive_count=1)
    producer = enforced.producer
    long_task = releasing.send("busy", "long", 7, credentials=producer)
    released = releasing.send("fails", "released", "error", credentials=producer)
    rejected = rejecting.send("fails", "rejected", "error", credentials=producer)
    env = worker_env(enforced, enforced.worker)
    ops = enforced.sqs(enforced.ops)
    with workers(
        (
            releasing,
            "threads",
            2,
            "releasing",
            releasing.env(
                options={"visibility_timeout": LEASE, "release_on_failure": True},
                IT_ACKS_ON_FAILURE="0",
                **env,
            ),
        ),
        (
            rejecting,
            "threads",
            1,
            "rejecting",
            rejecting.env(options={"visibility_timeout": LEASE}, IT_ACKS_ON_FAILURE="0", **env),
        ),
    ) as started:
        releasing.wait_for_executions(2, timeout=30)
        assert settle(
            lambda: (
                dead_letter_count(ops, releasing.queue) == 1
                and dead_letter_count(ops, rejecting.queue) == 1
            ),
            timeout=20,
        ), "the failed tasks' messages never reached their dead-letter queues"
        logs = [process.log for process in started]

    assert releasing.runs_per_task() == {long_task: 1, released: 1}
    assert rejecting.runs_per_task() == {rejected: 1}
    assert enforced.refused(enforced.producer, enforced.worker) == []
    for log in logs:
        assert "AccessDenied" not in log
        assert "Could not read the redrive policy" not in log
    assert_no_secret_in(logs, enforced)
    changes = [
        event
        for event in enforced.server.events()
        if event["queue"] == releasing.queue
        and event["action"] == "change_visibility"
        and event["result"] == "ok"
    ]
    renewals = [event for event in changes if event["visibility"] == LEASE]
    assert len(renewals) >= 2, changes  # 7 s of work under a 3 s lease
    assert any(event["visibility"] == 0 for event in changes), changes  # the release


def test_the_producer_can_only_publish_and_the_worker_only_to_its_queues(
    enforced: Enforced, tmp_path: Path
) -> None:
    bed = enforced.new_bed(tmp_path, "scoped")
    bed.send("busy", "never run", 0, credentials=enforced.producer)
    ops = enforced.sqs(enforced.ops)
    url = ops.get_queue_url(QueueName=bed.queue)["QueueUrl"]
    handle = ops.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"][0]["ReceiptHandle"]
    producer = enforced.sqs(enforced.producer)
    for call in (
        lambda: producer.receive_message(QueueUrl=url),
        lambda: producer.delete_message(QueueUrl=url, ReceiptHandle=handle),
        lambda: producer.change_message_visibility(
            QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0
        ),
    ):
        with pytest.raises(ClientError) as denied:
            call()
        assert denied.value.response["Error"]["Code"] == "AccessDenied"

    other = ops.create_queue(QueueName=f"other-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    with pytest.raises(ClientError) as denied:
        enforced.sqs(enforced.worker).receive_message(QueueUrl=other)
    assert denied.value.response["Error"]["Code"] == "AccessDenied"


def test_without_change_message_visibility_the_worker_cannot_renew(
    enforced: Enforced, tmp_path: Path
) -> None:
    bed = enforced.new_bed(tmp_path, "unrenewed")
    bed.send("busy", "long", 2 * LEASE, credentials=enforced.producer)
    keys = enforced.worker_without_renewals
    env = bed.env(options={"visibility_timeout": LEASE}, **worker_env(enforced, keys))
    with workers((bed, "threads", 1, "unrenewed", env)) as (process,):
        bed.wait_for_executions(1, timeout=30)
        log = process.log

    assert f"Renewing SQS leases on queue {bed.queue} failed" in log
    assert "AccessDenied" in log
    assert_no_secret_in([log], enforced)
    refused = enforced.refused(keys)
    assert refused, "no call was refused"
    assert {(r["action"], r["code"]) for r in refused} == {
        ("ChangeMessageVisibilityBatch", "AccessDenied")
    }
    assert all(r["message"].endswith("sqs:ChangeMessageVisibility") for r in refused)


def test_with_predefined_queues_neither_needs_list_queues(
    enforced: Enforced, tmp_path: Path
) -> None:
    bed = enforced.new_bed(tmp_path, "predefined")
    url = enforced.sqs(enforced.ops).get_queue_url(QueueName=bed.queue)["QueueUrl"]
    predefined = {"predefined_queues": {bed.queue: {"url": url}}}
    producer = enforced.producer_without_listing
    task_id = bed.send("busy", "short", 0.1, credentials=producer, transport_options=predefined)
    keys = enforced.worker_without_listing
    options = {"visibility_timeout": LEASE, **predefined}
    env = bed.env(options=options, **worker_env(enforced, keys))
    with workers((bed, "threads", 1, "predefined", env)) as (process,):
        bed.wait_for_executions(1, timeout=30)
        log = process.log

    assert bed.runs_per_task() == {task_id: 1}
    assert enforced.refused(producer, keys) == []
    assert_no_secret_in([log], enforced)


@needs_sns_fanout
def test_the_monitoring_policy_runs_events_and_inspect_with_nothing_refused(
    enforced: Enforced, tmp_path: Path
) -> None:
    bed = enforced.new_bed(tmp_path, "monitored")
    name = f"iam{uuid.uuid4().hex[:6]}"
    monitor = worker_env(enforced, enforced.monitor)
    worker_keys = worker_env(enforced, enforced.monitored_worker)
    with monitored_worker(bed, name, **worker_keys) as worker:
        with events_dump(bed, **monitor) as dump:
            task_id = bed.send("busy", "short", 0.1, credentials=enforced.producer)
            succeeded = f"task succeeded: tests.integration.app.busy({task_id})"
            wait_for(lambda: succeeded in dump.output, 30, "the task's events in the dump")
        ping = run_celery(
            bed, "inspect", "ping", "--timeout", "5", options=OPTIONS, timeout=60, **monitor
        )
    logs = [worker.output, dump.output, ping.stdout + ping.stderr]

    assert f"{name}@" in ping.stdout, ping.stdout + ping.stderr
    # Not the producer's: another test of this module has it refused on purpose.
    assert enforced.refused(enforced.monitored_worker, enforced.monitor) == []
    assert_no_secret_in(logs, enforced)


@needs_sns_fanout
def test_a_monitor_without_sns_subscribe_is_refused_by_name(
    enforced: Enforced, tmp_path: Path
) -> None:
    bed = enforced.new_bed(tmp_path, "unsubscribed")
    keys = enforced.monitor_without_subscribing
    dump = run_celery(
        bed, "events", "--dump", options=OPTIONS, timeout=60, **worker_env(enforced, keys)
    )
    output = dump.stdout + dump.stderr

    assert dump.returncode != 0, output
    assert "sns:Subscribe" in output, output
    refused = enforced.refused(keys)
    assert {(r["action"], r["code"]) for r in refused} == {("Subscribe", "AccessDenied")}, refused
    assert_no_secret_in([output], enforced)
