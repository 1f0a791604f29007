"""The queue keeper on its own: kombu's declare as a callable, a fake URL cache."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from celery_sqs_heartbeat.queues.keeper import QueueKeeper


class Port:
    def __init__(self) -> None:
        self._queue_cache = {"reply-q": "https://sqs/old"}

    def canonical_queue_name(self, queue_name: str) -> str:
        return queue_name.replace(".", "-")


def refused(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code}}, "GetQueueAttributes")


def test_a_declare_on_a_deleted_queues_url_forgets_it_and_declares_once_more() -> None:
    port = Port()
    keeper = QueueKeeper(port)
    answers: list[Any] = [refused("AWS.SimpleQueueService.NonExistentQueue"), "declared"]

    def kombu_declare() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert keeper.declare("reply.q", False, kombu_declare) == "declared"
    assert port._queue_cache == {}


def test_any_other_refusal_and_a_passive_declare_are_raised_as_they_are() -> None:
    keeper = QueueKeeper(Port())

    def denied() -> Any:
        raise refused("AccessDenied")

    def missing() -> Any:
        raise refused("AWS.SimpleQueueService.NonExistentQueue")

    with pytest.raises(ClientError):
        keeper.declare("reply.q", False, denied)
    with pytest.raises(ClientError):
        keeper.declare("reply.q", True, missing)


def test_a_queue_declared_with_a_ttl_is_created_with_that_retention() -> None:
    keeper = QueueKeeper(Port())
    keeper.note_retention("events.q", False, {"x-message-ttl": 300_000})
    attributes = {"VisibilityTimeout": "30"}

    assert keeper.creation_attributes("events-q", attributes) == {
        "VisibilityTimeout": "30",
        "MessageRetentionPeriod": "300",
    }
    assert keeper.creation_attributes("other", attributes) is attributes
