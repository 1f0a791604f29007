"""AWS answering a channel's set-up with "later": a connection error, which kombu retries."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from botocore.exceptions import BotoCoreError, ClientError
from kombu import Connection
from kombu.transport import SQS

from celery_sqs_heartbeat.leasing.manager import VisibilityExtensionManager
from celery_sqs_heartbeat.startup.unavailable import (
    SQSUnavailable,
    unavailable,
    unavailable_as_connection_error,
)

INTERNAL_ERROR = "We encountered an internal error. Please try again."


def answered(
    code: str, status: int, operation: str = "ListQueues", message: str = ""
) -> ClientError:
    """botocore's error for an answer of ``status`` with ``code``, as it raises it."""
    response = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, operation)  # type: ignore[arg-type]


def test_a_5xx_stands_as_a_connection_error_saying_what_was_answered() -> None:
    passing = unavailable(answered("InternalError", 500, message=INTERNAL_ERROR))

    assert isinstance(passing, SQSUnavailable)
    assert isinstance(passing, ConnectionError)
    assert str(passing) == (
        "AWS cannot answer for now: ListQueues answered InternalError (HTTP 500): "
        "We encountered an internal error. Please try again"  # Celery's log adds the stop
    )


def test_a_throttle_stands_as_a_connection_error_with_its_code_unwrapped() -> None:
    passing = unavailable(answered("AWS.SimpleQueueService.RequestThrottled", 403, "GetQueueUrl"))

    assert str(passing) == (
        "AWS cannot answer for now: GetQueueUrl answered RequestThrottled (HTTP 403)"
    )


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("AccessDenied", 403),
        ("InvalidClientTokenId", 403),
        ("AWS.SimpleQueueService.NonExistentQueue", 400),
        ("InvalidParameterValue", 400),
    ],
)
def test_a_mistake_of_the_configuration_stands_as_nothing_else(code: str, status: int) -> None:
    assert unavailable(answered(code, status)) is None


def test_inside_a_5xx_is_raised_as_the_connection_error_caused_by_botocores() -> None:
    error = answered("ServiceUnavailable", 503)

    with pytest.raises(SQSUnavailable) as raised, unavailable_as_connection_error():
        raise error

    assert raised.value.__cause__ is error


@pytest.mark.parametrize(
    "error",
    [answered("AccessDenied", 403), BotoCoreError(), ValueError("not AWS's")],
    ids=["denied", "botocore", "other"],
)
def test_inside_any_other_error_is_raised_as_it_came(error: Exception) -> None:
    with pytest.raises(type(error)) as raised, unavailable_as_connection_error():
        raise error

    assert raised.value is error


# --- the transport ------------------------------------------------------------------------


@pytest.fixture
def connection(manager: VisibilityExtensionManager) -> Iterator[Connection]:
    """A connection on the transport, with credentials, its manager the test's."""
    connection = Connection(
        "sqs://key:secret@127.0.0.1:9/",
        transport="celery_sqs_heartbeat:Transport",
        transport_options={"region": "us-east-1"},
    )
    connection.transport.manager = manager
    yield connection
    connection.release()


def test_the_transports_connection_errors_are_kombus_and_sqs_unavailable(
    connection: Connection,
) -> None:
    assert set(connection.connection_errors) == {*SQS.Transport.connection_errors, SQSUnavailable}
    # What kombu's ensure_connection, and so Celery's, retries.
    assert issubclass(SQSUnavailable, connection.recoverable_connection_errors)


def listing_answers(monkeypatch: pytest.MonkeyPatch, *answers: ClientError | None) -> list[str]:
    """kombu's ListQueues at a channel's start answers each of ``answers`` in turn (None:
    the queues); the calls made, noted."""
    left, calls = list(answers), []

    def list_queues(channel: SQS.Channel, prefix: str) -> None:
        calls.append("ListQueues")
        answer = left.pop(0)
        if answer is not None:
            raise answer

    monkeypatch.setattr(SQS.Channel, "_update_queue_cache", list_queues)
    return calls


def test_a_connection_whose_queue_listing_answers_5xx_is_retried_until_it_answers(
    connection: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = listing_answers(
        monkeypatch, answered("InternalError", 500), answered("Throttling", 400), None
    )
    retried: list[BaseException] = []

    connection.ensure_connection(
        errback=lambda error, interval: retried.append(error),
        max_retries=5,
        interval_start=0,
        interval_step=0,
    )

    assert calls == ["ListQueues"] * 3
    assert [type(error) for error in retried] == [SQSUnavailable, SQSUnavailable]
    assert connection.connected


def test_a_connection_whose_queue_listing_is_denied_fails_at_once(
    connection: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = listing_answers(monkeypatch, answered("AccessDenied", 403), None)
    retried: list[BaseException] = []

    with pytest.raises(ClientError, match="AccessDenied"):
        connection.ensure_connection(
            errback=lambda error, interval: retried.append(error),
            max_retries=5,
            interval_start=0,
            interval_step=0,
        )

    assert calls == ["ListQueues"]
    assert retried == []


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (answered("InternalError", 500, "GetQueueUrl"), SQSUnavailable),
        (answered("AccessDenied", 403, "GetQueueUrl"), ClientError),
    ],
    ids=["5xx", "denied"],
)
def test_a_declaration_answered_5xx_is_a_connection_error_and_a_denied_one_is_not(
    connection: Connection,
    monkeypatch: pytest.MonkeyPatch,
    error: ClientError,
    raised: type[Exception],
) -> None:
    """What Celery's consumer declares once connected: its task queues, its mailbox."""
    listing_answers(monkeypatch, None)
    channel = connection.channel()

    def new_queue(channel: SQS.Channel, queue: str, **kwargs: object) -> str:
        raise error

    monkeypatch.setattr(SQS.Channel, "_new_queue", new_queue)

    with pytest.raises(raised) as declared:
        channel.queue_declare("jobs")

    assert error in (declared.value, declared.value.__cause__)
