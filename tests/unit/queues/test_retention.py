"""A queue's declared message TTL becomes its SQS retention, at creation only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kombu import Connection, Queue
from kombu.transport import SQS

from celery_sqs_heartbeat.aws.sqs_facts import SQS_MAX_RETENTION_SECONDS, SQS_MIN_RETENTION_SECONDS
from celery_sqs_heartbeat.queues.retention import retention_seconds
from celery_sqs_heartbeat.transport import Channel


@pytest.mark.parametrize(
    ("ttl_ms", "seconds"),
    [
        (90_000, 90),
        (300_000, 300),
        (90_001, 91),
        (90_000.5, 91),
        (5_000, SQS_MIN_RETENTION_SECONDS),
        (0, SQS_MIN_RETENTION_SECONDS),
        (59_001, SQS_MIN_RETENTION_SECONDS),
        (SQS_MAX_RETENTION_SECONDS * 1000, SQS_MAX_RETENTION_SECONDS),
        (SQS_MAX_RETENTION_SECONDS * 1000 + 1, SQS_MAX_RETENTION_SECONDS),
    ],
)
def test_a_ttl_in_ms_is_rounded_up_to_seconds_within_sqs_range(ttl_ms: float, seconds: int) -> None:
    assert retention_seconds({"x-message-ttl": ttl_ms, "x-expires": 60_000}) == seconds


@pytest.mark.parametrize("arguments", [None, {}, {"x-expires": 60_000}, {"x-message-ttl": None}])
def test_without_a_ttl_sqs_keeps_its_own_retention(arguments: dict[str, Any] | None) -> None:
    assert retention_seconds(arguments) is None


@pytest.mark.parametrize("ttl", ["5000", True])
def test_a_ttl_that_is_no_number_is_named_in_the_error(ttl: Any) -> None:
    with pytest.raises(ValueError, match="x-message-ttl must be a number of milliseconds"):
        retention_seconds({"x-message-ttl": ttl})


class FakeClient:
    """The SQS client of a channel with no queue yet: it records each CreateQueue."""

    def __init__(self) -> None:
        self.created: dict[str, dict[str, str]] = {}

    def create_queue(self, QueueName: str, Attributes: dict[str, str]) -> dict[str, str]:
        self.created[QueueName] = Attributes
        return {"QueueUrl": f"https://sqs.invalid/1/{QueueName}"}

    def get_queue_attributes(self, QueueUrl: str, AttributeNames: list[str]) -> dict[str, Any]:
        """The size kombu asks for after each declaration: a new queue is empty."""
        return {"Attributes": {"ApproximateNumberOfMessages": "0"}}


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    fake = FakeClient()
    # No queue exists: every lookup misses, so a declaration creates its queue. kombu
    # 5.5 keeps its URL cache on the class, shared by every channel of the process.
    monkeypatch.setattr(SQS.Channel, "_update_queue_cache", lambda self, prefix: None)
    monkeypatch.setattr(SQS.Channel, "_queue_cache", {})
    monkeypatch.setattr(Channel, "sqs", lambda self, queue=None: fake)
    return fake


@contextmanager
def open_channel(**options: Any) -> Iterator[Any]:
    """A channel of this transport on a connection with ``options``, closed after."""
    connection = Connection(
        "sqs://key:secret@127.0.0.1:9/",
        transport="celery_sqs_heartbeat:Transport",
        transport_options={"region": "us-east-1", **options},
    )
    with connection:
        yield connection.channel()


@pytest.fixture
def channel(client: FakeClient) -> Iterator[Any]:
    with open_channel() as opened:
        yield opened


def test_a_queue_declared_with_a_ttl_is_created_with_that_retention(
    channel: Any, client: FakeClient
) -> None:
    events = Queue("celeryev.node-1", message_ttl=5.0, expires=60.0, auto_delete=True)
    events(channel).queue_declare()
    Queue("mailbox.pidbox", message_ttl=300.0)(channel).queue_declare()
    Queue("celery")(channel).queue_declare()

    assert client.created["celeryev-node-1"]["MessageRetentionPeriod"] == "60"
    assert client.created["mailbox-pidbox"]["MessageRetentionPeriod"] == "300"
    assert "MessageRetentionPeriod" not in client.created["celery"]


def test_sqs_creation_attributes_decide_over_the_ttl(client: FakeClient) -> None:
    options = {"sqs-creation-attributes": {"MessageRetentionPeriod": "600"}}
    with open_channel(**options) as channel:
        Queue("celeryev.node-1", message_ttl=5.0)(channel).queue_declare()

    assert client.created["celeryev-node-1"]["MessageRetentionPeriod"] == "600"
