"""The S3 statements of docs/iam.md for large task messages, proven with IAM enforced.

The SQS policies and the S3 statements are read from docs/iam.md as published, merged as a
user attaches them, and run by a real producer and worker on a server that enforces IAM
for SQS and S3 alike.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer
from tests.integration.harness import Bed, settle
from tests.integration.iam import Iam, Keys, allow, client, published_policy, without_action
from tests.integration.test_iam_policy import worker_env, workers

BUCKET = "celery-it-payloads"
PREFIX = "celery/"
LARGE = 1_100_000


def s3_statements(role: str) -> list[dict[str, Any]]:
    """The published S3 statements of ``role`` (worker, producer), for the test's bucket."""
    s3 = json.loads(json.dumps(published_policy(f"{role}-s3")).replace("BUCKET", BUCKET))
    statements: list[dict[str, Any]] = s3["Statement"]
    return statements


def with_s3(role: str) -> dict[str, Any]:
    """The role's SQS policy with its S3 statements added."""
    sqs = published_policy(role)
    return {**sqs, "Statement": [*sqs["Statement"], *s3_statements(role)]}


@dataclass(frozen=True)
class Enforced:
    server: StrictSQSServer
    producer: Keys
    worker: Keys
    worker_without_delete: Keys
    ops_keys: Keys

    @property
    def ops(self) -> Any:
        return client(self.server, "s3", self.ops_keys)

    def objects(self) -> list[str]:
        listed = self.ops.list_objects_v2(Bucket=BUCKET).get("Contents") or []
        return [entry["Key"] for entry in listed]

    def new_bed(self, tmp_path: Path, name: str) -> Bed:
        queue = f"celery-it-{uuid.uuid4().hex[:8]}"
        bed = Bed(self.server, queue, tmp_path / f"{name}.jsonl", tmp_path)
        sqs = client(self.server, "sqs", self.ops_keys)
        sqs.create_queue(QueueName=bed.queue, Attributes={"VisibilityTimeout": "30"})
        return bed


def iam_setup(iam: Iam) -> Enforced:
    """The users of this module and its bucket, made before the ``enforced`` fixture
    enforces IAM. ``ops`` stands for the infrastructure code: allowed all of SQS and S3."""
    worker = with_s3("worker")
    setup = Enforced(
        server=iam.server,
        producer=iam.user("producer", with_s3("producer")),
        worker=iam.user("worker", worker),
        worker_without_delete=iam.user(
            "worker-without-delete", without_action(worker, "s3:DeleteObject")
        ),
        ops_keys=iam.user("ops", allow(["sqs:*", "s3:*"], "*")),
    )
    setup.ops.create_bucket(Bucket=BUCKET)
    return setup


OPTIONS = {"large_payload_bucket": BUCKET, "large_payload_prefix": PREFIX}


def test_the_readme_s3_statements_carry_a_large_task_with_nothing_refused(
    enforced: Enforced, tmp_path: Path
) -> None:
    bed = enforced.new_bed(tmp_path, "allowed")
    task_id = bed.send(
        "sized", "large", "x" * LARGE, credentials=enforced.producer, transport_options=OPTIONS
    )
    [key] = [k for k in enforced.objects() if k.startswith(PREFIX)]
    env = bed.env(options=OPTIONS, **worker_env(enforced, enforced.worker))
    with workers((bed, "threads", 1, "s3-worker", env)) as (process,):
        bed.wait_for_executions(1, timeout=30)
        gone = settle(lambda: key not in enforced.objects())
        log = process.log
    assert bed.runs_per_task() == {task_id: 1}, log
    assert gone, log
    assert "AccessDenied" not in log and "Cannot" not in log
    assert enforced.server.refused_calls() == []


def test_the_producer_cannot_read_and_a_worker_without_delete_leaves_the_object(
    enforced: Enforced, tmp_path: Path
) -> None:
    bed = enforced.new_bed(tmp_path, "denied")
    bed.send(
        "sized", "large", "x" * LARGE, credentials=enforced.producer, transport_options=OPTIONS
    )
    [key] = [k for k in enforced.objects() if k.startswith(PREFIX)]
    producer = client(enforced.server, "s3", enforced.producer)
    with pytest.raises(producer.exceptions.ClientError, match="AccessDenied"):
        producer.get_object(Bucket=BUCKET, Key=key)
    env = bed.env(options=OPTIONS, **worker_env(enforced, enforced.worker_without_delete))
    with workers((bed, "threads", 1, "s3-no-delete", env)) as (process,):
        bed.wait_for_executions(1, timeout=30)
        logged = settle(lambda: "Cannot delete the objects" in process.log)
        log = process.log
    assert logged, log
    assert f"bucket {BUCKET} (AccessDenied)" in log
    assert key in enforced.objects()
    enforced.ops.delete_object(Bucket=BUCKET, Key=key)
