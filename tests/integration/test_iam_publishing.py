"""Publishing in SendMessageBatch calls with the least IAM policy of docs/iam.md (issue 27).

IAM has no action of its own for ``SendMessageBatch``: AWS authorises it as
``sqs:SendMessage``, as the strict server does (``celery_sqs_heartbeat.testing.iam``).
These tests publish from this process inside ``publishing_in_batches()`` on a server
that enforces IAM, with the producer policy (and its S3 statements) read from docs/iam.md
as published:

- a producer user, to a standard queue, bodies through S3 included: nothing refused;
- the same user less ``sqs:SendMessage``: the scope raises one ``PublishingFailed``
  naming every task, after one refused call, not ten tries;
- a predefined queue with ``sts_role_arn``: the batch calls are signed by the role's
  session credentials, never by the base user's key, which may only assume the role.

Which key signed each call is read from moto's request recorder, as in
``test_predefined_queues.py``. Checking SQS's messages needs no worker: ``ops`` reads them.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from celery import Celery

from celery_sqs_heartbeat import PublishingFailed, publishing_in_batches
from celery_sqs_heartbeat.testing import StrictSQSServer
from tests.integration.harness import broker_url, report
from tests.integration.iam import (
    Call,
    Iam,
    Keys,
    allow,
    client,
    published_policy,
    recorded,
    without_action,
)
from tests.integration.test_iam_large_payloads import BUCKET, LARGE, with_s3
from tests.integration.test_predefined_queues import LARGE_PAYLOADS

BUSY = "tests.integration.app.busy"
#: The ``enforced`` fixture's server records every request: which key signed each call.
IAM_RECORDING = True
SIZED = "tests.integration.app.sized"


@dataclass(frozen=True)
class Setup:
    """A server that enforces IAM and records every request; its users and role."""

    server: StrictSQSServer
    ops: Keys
    producer: Keys
    """The published producer policy with its S3 statements."""
    producer_without_send: Keys
    sts_base: Keys
    """May assume the role, and nothing else."""
    role_arn: str

    def sqs(self) -> Any:
        return client(self.server, "sqs", self.ops)

    def new_queue(self) -> tuple[str, str]:
        """A queue under the policies' ``celery*`` prefix, made by ops: its name and URL."""
        name = f"celery-it-{uuid.uuid4().hex[:8]}"
        return name, self.sqs().create_queue(QueueName=name)["QueueUrl"]

    def task_ids_in(self, url: str) -> list[str]:
        """The task id of every message in the queue, read by ops; hidden after."""
        found: list[str] = []
        sqs = self.sqs()
        while True:
            answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)
            messages = answer.get("Messages") or []
            if not messages:
                return found
            found.extend(
                json.loads(base64.b64decode(self._body(m["Body"])))["headers"]["id"]
                for m in messages
            )

    def _body(self, body: str) -> str:
        """The body itself, read from S3 if SQS holds a pointer to it."""
        if not body.startswith("["):
            return body
        pointer = json.loads(body)[1]
        s3 = client(self.server, "s3", self.ops)
        stored = s3.get_object(Bucket=pointer["s3BucketName"], Key=pointer["s3Key"])
        return str(stored["Body"].read().decode())

    def recorded(self) -> list[Call]:
        return recorded(self.server)


def iam_setup(iam: Iam) -> Setup:
    """The users and role of this module and its bucket, made before the ``enforced``
    fixture enforces IAM; ``ops`` stands for the infrastructure code."""
    role_name = f"celery-producer-{uuid.uuid4().hex[:8]}"
    role_arn = iam.role(role_name, "sts-base", published_policy("producer"))
    producer = with_s3("producer")
    setup = Setup(
        server=iam.server,
        ops=iam.user("ops", allow(["sqs:*", "s3:*"], "*")),
        producer=iam.user("producer", producer),
        producer_without_send=iam.user(
            "producer-without-send", without_action(producer, "sqs:SendMessage")
        ),
        sts_base=iam.user("sts-base", allow("sts:AssumeRole", role_arn)),
        role_arn=role_arn,
    )
    iam.admin("s3").create_bucket(Bucket=BUCKET)
    return setup


def producer(setup: Setup, keys: Keys, queue: str, **options: Any) -> Celery:
    app = Celery("iam-batch-producer", set_as_current=False)
    app.conf.update(
        broker_url=broker_url(setup.server, *keys),
        broker_transport="celery_sqs_heartbeat:Transport",
        broker_transport_options={"region": "us-east-1", "is_secure": False, **options},
        task_default_queue=queue,
    )
    return app


def test_the_published_producer_policy_publishes_in_a_scope_bodies_through_s3_included(
    enforced: Setup,
) -> None:
    queue, url = enforced.new_queue()
    refused_before = len(enforced.server.refused_calls())
    enforced.server.reset_calls()
    app = producer(enforced, enforced.producer, queue, **LARGE_PAYLOADS)
    with app, publishing_in_batches():
        sent = [app.send_task(BUSY, args=(f"t{n}", 0)).id for n in range(12)]
        sent.append(app.send_task(SIZED, args=("large", "x" * LARGE)).id)
    calls = enforced.server.calls()
    refused = enforced.server.refused_calls()[refused_before:]
    held = enforced.task_ids_in(url)
    report("iam batch publishing", calls=calls, refused=refused)
    assert refused == []
    assert calls.get("SendMessageBatch", 0) >= 2 and "SendMessage" not in calls, calls
    assert calls.get("s3:PutObject") == 1, calls
    assert sorted(held) == sorted(sent)


def test_without_send_message_the_scope_names_every_task_after_one_refused_call(
    enforced: Setup,
) -> None:
    """An access denied is refused for good: one call, not ten tries over 21 s."""
    queue, url = enforced.new_queue()
    keys = enforced.producer_without_send
    sent: list[str] = []
    app = producer(enforced, keys, queue)
    with app, pytest.raises(PublishingFailed) as failed, publishing_in_batches():
        sent.extend(app.send_task(BUSY, args=(f"t{n}", 0)).id for n in range(3))
    refused = [r for r in enforced.server.refused_calls() if r["access_key_id"] == keys[0]]
    report("iam batch publishing denied", message=str(failed.value), refused=refused)
    assert failed.value.task_ids == sent
    assert all("AccessDenied" in reason for reason in failed.value.reasons.values())
    # One call for the three (two if the 50 ms wait cut them), each refused once: a
    # retried access denied would be refused ten times a call.
    assert 1 <= len(refused) <= 2, refused
    assert {(r["action"], r["code"]) for r in refused} == {("SendMessageBatch", "AccessDenied")}
    assert all(r["message"].endswith("not authorized to perform: sqs:SendMessage") for r in refused)
    assert enforced.task_ids_in(url) == []


def test_a_predefined_queue_with_an_sts_role_is_published_to_with_the_role_s_credentials(
    enforced: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base user may only assume the role: a call it signed would be refused."""
    queue, url = enforced.new_queue()
    # kombu assumes the role with a plain boto3.client("sts"): the base user's keys from
    # the environment, through a default session made afresh for them.
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", enforced.sts_base[0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", enforced.sts_base[1])
    monkeypatch.setenv("AWS_DEFAULT_REGION", StrictSQSServer.REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", enforced.server.endpoint_url)
    recorded_before = len(enforced.recorded())
    refused_before = len(enforced.server.refused_calls())
    options = {"predefined_queues": {queue: {"url": url}}, "sts_role_arn": enforced.role_arn}
    app = producer(enforced, enforced.sts_base, queue, **options)
    with app, publishing_in_batches():
        sent = [app.send_task(BUSY, args=(f"t{n}", 0)).id for n in range(12)]
    calls = enforced.recorded()[recorded_before:]
    refused = enforced.server.refused_calls()[refused_before:]
    batches = [c for c in calls if c.action == "SendMessageBatch"]
    assumed = [c for c in calls if c.action == "AssumeRole"]
    report(
        "sts role batch publishing",
        actions=[c.action for c in calls],
        batch_keys=sorted({c.access_key_id for c in batches}),
        refused=refused,
    )
    assert refused == []
    assert [c.access_key_id for c in assumed] == [enforced.sts_base[0]]
    assert 2 <= len(batches) < len(sent) and all(c.queue_url == url for c in batches), batches
    assert all(c.has_session_token for c in batches)
    assert enforced.sts_base[0] not in {c.access_key_id for c in batches}
    assert not [c for c in calls if c.action == "SendMessage"]
    assert sorted(enforced.task_ids_in(url)) == sorted(sent)
