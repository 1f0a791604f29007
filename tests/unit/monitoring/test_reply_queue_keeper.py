"""The reply queue keeper on its own: a fake channel port, kombu's put a callable."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from botocore.exceptions import ClientError

from celery_sqs_heartbeat.monitoring.reply_queue_keeper import ReplyQueueKeeper

REPLY_QUEUE = "7f1c0d6e.reply.celery.pidbox"


class Port:
    predefined_queues: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        self._queue_cache = {"7f1c0d6e-reply-celery-pidbox": "https://sqs/reply"}

    def canonical_queue_name(self, queue_name: str) -> str:
        return queue_name.replace(".", "-")

    def sqs(self, queue: str | None = None) -> Any:
        return object()


def refusing(code: str) -> Any:
    def kombu_put() -> None:
        raise ClientError({"Error": {"Code": code}}, "SendMessage")

    return kombu_put


def test_a_reply_to_a_reply_queue_gone_is_dropped_and_its_url_forgotten() -> None:
    port = Port()

    ReplyQueueKeeper(port).put(REPLY_QUEUE, refusing("AWS.SimpleQueueService.NonExistentQueue"))

    assert port._queue_cache == {}


def test_any_other_refusal_or_queue_is_raised() -> None:
    keeper = ReplyQueueKeeper(Port())

    with pytest.raises(ClientError):
        keeper.put(REPLY_QUEUE, refusing("AccessDenied"))
    with pytest.raises(ClientError):
        keeper.put("jobs", refusing("AWS.SimpleQueueService.NonExistentQueue"))


def test_a_reply_queue_not_kept_is_kombus_to_delete() -> None:
    deleted: list[str] = []

    ReplyQueueKeeper(Port()).after_reply_received("unknown.reply.celery.pidbox", deleted.append)

    assert deleted == ["unknown.reply.celery.pidbox"]
