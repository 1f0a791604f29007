"""SQS failing for a while as a channel is set up: a connection error, which Celery retries.

A channel lists the queues as it is made (kombu's ``ListQueues``); declaring a queue
looks up its URL or creates it; binding and consuming one may make its SNS topic and
subscribe it (``ListSubscriptionsByTopic``, ``GetQueueUrl``, ``Subscribe``). SQS or SNS
answering one of those with a 5xx or a throttle raised botocore's ``ClientError``, which
is none of kombu's connection errors: Celery took it for an unrecoverable error, and a
worker started during an outage, or whose connection dropped in one, exited instead of
waiting for SQS to come back (found by the chaos soak).

Such an answer is raised instead as :class:`SQSUnavailable`, one of the transport's
connection errors. Celery then retries the connection at start-up
(``broker_connection_retry_on_startup``) as after it (``broker_connection_retry``).
Every other answer is raised as it came: a mistake of the configuration (access denied,
credentials SQS does not know, a queue that does not exist) still stops the worker at
once, where retrying it would only hide it behind minutes of reconnects.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import ClientError

from ..aws.sqs_facts import error_code, says_retry_later

__all__ = ["SQSUnavailable", "unavailable", "unavailable_as_connection_error"]


class SQSUnavailable(ConnectionError):
    """SQS (or SNS) answered a call setting a channel up with "later": a 5xx or a throttle.

    Python's ``ConnectionError``, an ``OSError``, which every kombu transport over
    sockets counts among its connection errors (kombu's SQS transport lists
    ``socket.error``); the botocore ``ClientError`` it stands for is its ``__cause__``.
    """


def unavailable(error: ClientError) -> SQSUnavailable | None:
    """The connection error standing for ``error``, if its answer says to try again later."""
    details = error.response.get("Error", {})
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if not says_retry_later(details.get("Code"), status):
        return None
    said = str(details.get("Message") or "").rstrip(".")
    return SQSUnavailable(
        f"AWS cannot answer for now: {error.operation_name} answered "
        f"{error_code(details.get('Code'))} (HTTP {status}){f': {said}' if said else ''}"
    )


@contextmanager
def unavailable_as_connection_error() -> Iterator[None]:
    """Inside, an answer saying to try again later is raised as :class:`SQSUnavailable`."""
    try:
        yield
    except ClientError as error:
        passing = unavailable(error)
        if passing is None:
            raise
        raise passing from error
