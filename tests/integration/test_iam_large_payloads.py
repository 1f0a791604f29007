"""The S3 statements of docs/iam.md for large task messages, proven with IAM enforced.

The SQS policies and the S3 statements are read from docs/iam.md as published, merged as a
user attaches them, and run by a real producer and worker on a server that enforces IAM
for SQS and S3 alike.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer
from tests.integration.harness import Bed, settle
from tests.integration.test_iam_policy import (
    Keys,
    make_user,
    published_policy,
    without_action,
    worker_env,
    workers,
)

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
    ops_kwargs: dict[str, Any]

    @property
    def ops(self) -> Any:
        return boto3.client("s3", config=self.server.s3_config, **self.ops_kwargs)

    def objects(self) -> list[str]:
        listed = self.ops.list_objects_v2(Bucket=BUCKET).get("Contents") or []
        return [entry["Key"] for entry in listed]

    def new_bed(self, tmp_path: Path, name: str) -> Bed:
        queue = f"celery-it-{uuid.uuid4().hex[:8]}"
        bed = Bed(self.server, queue, tmp_path / f"{name}.jsonl", tmp_path)
        sqs = boto3.client("sqs", **self.ops_kwargs)
        sqs.create_queue(QueueName=bed.queue, Attributes={"VisibilityTimeout": "30"})
        return bed


@pytest.fixture(scope="module")
def enforced() -> Iterator[Enforced]:
    """Its own server: enforcement cannot be turned off. ``ops`` is the server's own key."""
    with StrictSQSServer() as server:
        iam = boto3.client("iam", **server.boto3_kwargs)
        everything = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["sqs:*", "s3:*"], "Resource": "*"}],
        }
        ops_keys = make_user(iam, "ops", everything)
        ops_kwargs = {
            **server.boto3_kwargs,
            "aws_access_key_id": ops_keys[0],
            "aws_secret_access_key": ops_keys[1],
        }
        worker = with_s3("worker")
        setup = Enforced(
            server=server,
            producer=make_user(iam, "producer", with_s3("producer")),
            worker=make_user(iam, "worker", worker),
            worker_without_delete=make_user(
                iam, "worker-without-delete", without_action(worker, "s3:DeleteObject")
            ),
            ops_kwargs=ops_kwargs,
        )
        setup.ops.create_bucket(Bucket=BUCKET)
        server.enforce_iam()
        yield setup


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
    producer = boto3.client(
        "s3",
        config=enforced.server.s3_config,
        endpoint_url=enforced.server.endpoint_url,
        region_name=enforced.server.REGION,
        aws_access_key_id=enforced.producer[0],
        aws_secret_access_key=enforced.producer[1],
    )
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
