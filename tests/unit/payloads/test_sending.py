"""A SendMessage's object: deleted when SQS surely did not take the message, kept else.

Real botocore calls, answered by a ``before-send`` hook: SQS's error, or a network fault.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import botocore.session
import pytest
from botocore.awsrequest import AWSResponse
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from celery_sqs_heartbeat.payloads.options import LargePayloadOptions
from celery_sqs_heartbeat.payloads.sending import offload_on_send
from celery_sqs_heartbeat.payloads.store import PayloadStore
from celery_sqs_heartbeat.process import ProcessState

URL = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"

#: One try's fate: SQS's answer (an HTTP status) or a network fault.
Try = int | Exception


class FakeS3:
    def __init__(self) -> None:
        self.put: list[str] = []
        self.deleted: list[str] = []

    def put_object(self, Key: str, **_: Any) -> None:
        self.put.append(Key)

    def delete_objects(self, Delete: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.deleted.extend(entry["Key"] for entry in Delete["Objects"])
        return {}


class _Raw:
    def stream(self) -> Iterator[bytes]:
        yield b'{"__type": "com.amazonaws.sqs#InternalError", "message": "no"}'


@pytest.fixture
def s3(process_state: ProcessState, monkeypatch: pytest.MonkeyPatch) -> FakeS3:
    fake = FakeS3()
    monkeypatch.setattr(process_state.clients, "s3", lambda _: fake)
    return fake


def sqs_answering(tries: list[Try]) -> BaseClient:
    """An SQS client whose SendMessage tries end as ``tries`` say, each retried at once."""
    client = botocore.session.Session().create_client(
        "sqs",
        region_name="us-east-1",
        aws_access_key_id="a",
        aws_secret_access_key="b",
        config=Config(retries={"total_max_attempts": 1}),
    )
    fates = iter(tries)

    def answer(request: Any, **_: Any) -> AWSResponse:
        fate = next(fates)
        if isinstance(fate, Exception):
            raise fate
        return AWSResponse(request.url, fate, {}, _Raw())

    def again(attempts: int, **_: Any) -> float | None:
        return 0.0 if attempts < len(tries) else None

    client.meta.events.register("before-send.sqs.SendMessage", answer)
    client.meta.events.register("needs-retry.sqs.SendMessage", again)
    return client


def send(client: BaseClient, s3: FakeS3) -> Callable[[], None]:
    offload_on_send(client, PayloadStore(LargePayloadOptions("tasks", threshold=None)))
    return lambda: client.send_message(QueueUrl=URL, MessageBody="x")


TIMEOUT = ReadTimeoutError(endpoint_url=URL)
NO_CONNECTION = EndpointConnectionError(endpoint_url=URL)


@pytest.mark.parametrize(
    ("tries", "raised", "deleted"),
    [
        ([500], ClientError, True),
        ([500, 500, 503], ClientError, True),
        ([NO_CONNECTION], EndpointConnectionError, True),
        ([NO_CONNECTION, 500], ClientError, True),
        ([TIMEOUT], ReadTimeoutError, False),
        # The first try may have put the message in SQS; the last try's error says nothing of it.
        ([TIMEOUT, 500], ClientError, False),
        ([500, TIMEOUT], ReadTimeoutError, False),
    ],
)
def test_the_object_goes_only_if_every_try_was_refused_or_never_sent(
    s3: FakeS3, tries: list[Try], raised: type[Exception], deleted: bool
) -> None:
    with pytest.raises(raised):
        send(sqs_answering(tries), s3)()
    assert len(s3.put) == 1
    assert s3.deleted == (s3.put if deleted else [])


@pytest.mark.parametrize("tries", [[200], [500, 200]])
def test_a_message_sqs_took_keeps_its_object(s3: FakeS3, tries: list[Try]) -> None:
    send(sqs_answering(tries), s3)()
    assert len(s3.put) == 1 and s3.deleted == []
