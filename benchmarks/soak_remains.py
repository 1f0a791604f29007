"""What a soak run makes on its strict server, and what is left of it at the end.

The run means to keep its two task queues, the workers' mailboxes (a stopped worker's
stays, for the next one of its name) and kombu's two topics; anything else left after
``celery sqs-reap --delete`` is a leftover: a queue, a subscription, a topic, an S3
object, or a message still in a task queue.
"""

from __future__ import annotations

import base64
import collections
import json
from collections.abc import Sequence
from typing import Any

import boto3
from soak_report import Leftovers

from celery_sqs_heartbeat.testing import StrictSQSServer

PREFIX = "soak-"
QUEUE = "tasks"
FIFO_QUEUE = "tasks.fifo"
BUCKET = "soak-payloads"
#: Topics kombu makes for the events and the mailboxes, kept by design (docs/monitoring.md).
KEPT_TOPICS = (f"{PREFIX}celeryev", f"{PREFIX}celery-pidbox")
_COUNTS = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)


class Remains:
    """The server's SQS, SNS and S3, as the run's set-up and its final check see them."""

    def __init__(self, server: StrictSQSServer) -> None:
        self.sqs: Any = boto3.client("sqs", **server.boto3_kwargs)
        self.sns: Any = boto3.client("sns", **server.boto3_kwargs)
        self.s3: Any = boto3.client("s3", config=server.s3_config, **server.boto3_kwargs)

    def make_queues(self, lease: int) -> None:
        """Made up front, as ops teams do; the FIFO queue must be, and the bucket too."""
        self.sqs.create_queue(
            QueueName=PREFIX + QUEUE, Attributes={"VisibilityTimeout": str(lease)}
        )
        self.sqs.create_queue(
            QueueName=PREFIX + FIFO_QUEUE,
            Attributes={"FifoQueue": "true", "VisibilityTimeout": str(lease)},
        )
        self.s3.create_bucket(Bucket=BUCKET)

    def leftovers(
        self,
        nodes: Sequence[str],
        failed_tries: collections.Counter[str],
        kept_objects: dict[str, str],
    ) -> Leftovers:
        """Every queue, subscription, topic and S3 object the run did not mean to keep;
        ``failed_tries``: the producer's failed publishes by task id; ``kept_objects``: the
        tasks whose object may stay, and why (``soak_verdicts.objects_kept``)."""
        queues = {
            url.rsplit("/", 1)[1]
            for url in self.sqs.list_queues(QueueNamePrefix=PREFIX).get("QueueUrls", [])
        }
        kept = {PREFIX + QUEUE, PREFIX + FIFO_QUEUE} | {
            name for name in queues if is_mailbox(name, nodes)
        }
        topics = [t["TopicArn"].rsplit(":", 1)[1] for t in self.sns.list_topics()["Topics"]]
        subscriptions = [
            f"{s['TopicArn'].rsplit(':', 1)[1]} -> {s['Endpoint'].rsplit(':', 1)[1]}"
            for s in self.sns.list_subscriptions()["Subscriptions"]
        ]
        objects, orphans, objects_kept = self._objects_left(failed_tries, kept_objects)
        return Leftovers(
            queues=sorted(queues - kept),
            subscriptions=sorted(s for s in subscriptions if s.split(" -> ")[1] not in kept),
            topics=sorted(set(topics) - set(KEPT_TOPICS)),
            objects=objects,
            orphans=orphans,
            messages=self.messages_left(),
            kept=objects_kept,
        )

    def messages_left(self) -> int:
        """Messages in the task queues: visible, in flight or delayed."""
        total = 0
        for name in (QUEUE, FIFO_QUEUE):
            url = self.sqs.get_queue_url(QueueName=PREFIX + name)["QueueUrl"]
            counts = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(_COUNTS))
            total += sum(int(counts["Attributes"][key]) for key in _COUNTS)
        return total

    def _objects_left(
        self, failed_tries: collections.Counter[str], kept_objects: dict[str, str]
    ) -> tuple[list[str], list[str], list[str]]:
        """The bucket's objects, each named with its task; apart, those of a task whose
        publish failed (the body holds the message, and its headers the task id), and
        those kept on purpose, named with why (:class:`Leftovers`)."""
        objects: list[str] = []
        orphans: list[str] = []
        kept: list[str] = []
        for entry in self.s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
            body = self.s3.get_object(Bucket=BUCKET, Key=entry["Key"])["Body"].read()
            task_id = task_id_of(body) or ""
            name = f"{entry['Key']} (task {task_id or None})"
            if failed_tries[task_id]:
                orphans.append(name)
            elif task_id in kept_objects:
                kept.append(f"{name}, {kept_objects[task_id]}")
            else:
                objects.append(name)
        return sorted(objects), sorted(orphans), sorted(kept)


def task_id_of(body: bytes) -> str | None:
    """The task id in a kombu SQS body: base64 of the JSON envelope, headers and all."""
    try:
        return str(json.loads(base64.b64decode(body))["headers"]["id"])
    except (ValueError, KeyError, TypeError):
        return None


def is_mailbox(queue: str, nodes: Sequence[str]) -> bool:
    """A worker's mailbox: ``soak-w1_host-celery-pidbox`` for the node ``w1@host``."""
    return queue.endswith("-celery-pidbox") and any(
        queue.startswith(f"{PREFIX}{node}_") for node in nodes
    )
