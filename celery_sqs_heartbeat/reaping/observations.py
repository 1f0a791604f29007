"""The facts the reaper judges by, read from SQS and SNS, and the deletes it makes: thin.

Everything goes through the app's own kombu channel (its clients, region, credentials,
``queue_name_prefix`` and SQS naming), so the reaper looks where the app's workers and
monitors put their queues. Times are SQS's own clock (the ``Date`` of its answers), so
ages are measured on one clock with ``CreatedTimestamp`` and ``SentTimestamp``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from botocore.exceptions import ClientError
from celery import Celery

from ..aws.sqs_facts import QUEUE_MISSING_CODES, SNS_NOT_FOUND, SQS_MAX_MESSAGES, canonical_code

__all__ = ["Observer", "Queue", "SubscriptionRow"]


@dataclass(frozen=True)
class Queue:
    """A queue of the app: its full SQS name, its URL, and its name less the prefix."""

    name: str
    url: str
    short_name: str


@dataclass(frozen=True)
class SubscriptionRow:
    """An SQS subscription of a topic: its ARN, the topic's name, the queue's name."""

    arn: str
    topic: str
    queue: str


class Observer:
    """Reads queues, subscriptions and pings through ``channel``; deletes when told."""

    def __init__(self, app: Celery, channel: Any) -> None:
        self._app = app
        self._channel = channel
        self._sqs = channel.sqs()
        self.prefix = channel.canonical_queue_name("")

    def queues(self) -> list[Queue]:
        """Every queue whose name starts with the app's prefix."""
        return [
            Queue(url.rsplit("/", 1)[1], url, url.rsplit("/", 1)[1][len(self.prefix) :])
            for url in self._queue_urls()
        ]

    def _queue_urls(self) -> Iterator[str]:
        token: str | None = None
        while True:
            page = self._sqs.list_queues(
                QueueNamePrefix=self.prefix,
                MaxResults=1000,
                **({"NextToken": token} if token else {}),
            )
            yield from page.get("QueueUrls", [])
            token = page.get("NextToken")
            if not token:
                return

    def attributes(self, queue: Queue) -> tuple[dict[str, str], float] | None:
        """The queue's creation time and redrive policy, and SQS's clock then; None if gone
        since the listing (a monitor that stopped meanwhile deleted it)."""
        try:
            answer = self._sqs.get_queue_attributes(
                QueueUrl=queue.url, AttributeNames=["CreatedTimestamp", "RedrivePolicy"]
            )
        except ClientError as error:
            if _is_missing(error):
                return None
            raise
        return answer.get("Attributes", {}), _server_time(answer)

    def oldest_unread(self, queue: Queue) -> tuple[float | None, float]:
        """The ``SentTimestamp`` of the oldest message seen visible, and SQS's clock then.

        Received with a visibility timeout of 0: each stays visible to its consumer.
        None if no message was seen, or the queue is gone since the listing.
        """
        try:
            answer = self._sqs.receive_message(
                QueueUrl=queue.url,
                MaxNumberOfMessages=SQS_MAX_MESSAGES,
                VisibilityTimeout=0,
                WaitTimeSeconds=0,
                AttributeNames=["SentTimestamp"],
            )
        except ClientError as error:
            if _is_missing(error):  # gone since the listing: nothing to judge it by
                return None, time.time()
            raise
        sent = [int(m["Attributes"]["SentTimestamp"]) / 1000 for m in answer.get("Messages", [])]
        return (min(sent) if sent else None), _server_time(answer)

    def sqs_name(self, name: str) -> str:
        """``name`` as kombu spells it on SQS and SNS (queue, topic): prefixed, dots as dashes."""
        return str(self._channel.canonical_queue_name(name))

    def subscriptions(self, topic: str, account: str) -> list[SubscriptionRow]:
        """The SQS subscriptions of ``topic``; none if the topic does not exist."""
        sns = self._channel.fanout.get_client()
        topic_arn = f"arn:aws:sns:{sns.meta.region_name}:{account}:{topic}"
        rows: list[SubscriptionRow] = []
        try:
            for page in sns.get_paginator("list_subscriptions_by_topic").paginate(
                TopicArn=topic_arn
            ):
                rows.extend(
                    SubscriptionRow(s["SubscriptionArn"], topic, s["Endpoint"].rsplit(":", 1)[1])
                    for s in page.get("Subscriptions", [])
                    if s.get("Protocol", "").lower() == "sqs"
                )
        except ClientError as error:
            if _code(error) != SNS_NOT_FOUND:
                raise
        return rows

    def queue_exists(self, name: str) -> bool:
        """Whether a queue of this name exists now (GetQueueUrl, not the eventual listing)."""
        try:
            self._sqs.get_queue_url(QueueName=name)
        except ClientError as error:
            if _is_missing(error):
                return False
            raise
        return True

    def answering_mailboxes(self, tries: int, timeout: float) -> set[str]:
        """The SQS names of the mailboxes of the nodes that answered any of ``tries`` pings."""
        mailbox = self._app.control.mailbox
        nodes: set[str] = set()
        for _ in range(tries):
            for reply in self._app.control.ping(timeout=timeout) or []:
                nodes.update(reply)
        return {self.sqs_name(f"{node}.{mailbox.namespace}.pidbox") for node in nodes}

    def delete_queue(self, queue: Queue) -> None:
        """Delete the queue; one gone already (its owner left meanwhile) is as good."""
        try:
            self._sqs.delete_queue(QueueUrl=queue.url)
        except ClientError as error:
            if not _is_missing(error):
                raise

    def unsubscribe(self, arn: str) -> None:
        """Remove the subscription; one gone already is as good."""
        try:
            self._channel.fanout.get_client().unsubscribe(SubscriptionArn=arn)
        except ClientError as error:
            if _code(error) != SNS_NOT_FOUND:
                raise


def _code(error: ClientError) -> str:
    return canonical_code(error.response.get("Error", {}).get("Code"))


def _is_missing(error: ClientError) -> bool:
    """Whether SQS answered that the queue does not exist."""
    return _code(error) in QUEUE_MISSING_CODES


def _server_time(answer: dict[str, Any]) -> float:
    """SQS's clock when it answered, from the ``Date`` header; this host's if none."""
    date = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    return parsedate_to_datetime(date).timestamp() if date else time.time()
