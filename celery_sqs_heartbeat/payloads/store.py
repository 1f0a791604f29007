"""The thin layer that talks to S3 for bodies too large for SQS: put, get, delete.

Decisions live in :mod:`celery_sqs_heartbeat.payloads.pointers`; this module makes the calls, each
naming the bucket's expected owner when it is known (``ExpectedBucketOwner``: a bucket
of the same name in another account is refused by S3, not read or written). The
S3 client of a queue is made from that queue's SQS client: same region, same
credentials object (so a predefined queue's STS role, and credentials that refresh
themselves, hold for S3 too), and the same endpoint when it is not AWS's (a local
stack, such as the project's strict server or LocalStack, serves S3 beside SQS).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import BotoCoreError, ClientError
from celery.utils.log import get_logger

from ..leasing.leases import Lease
from ..process import this_process
from .cleanup import Owned, error_name, owned_by
from .options import LargePayloadOptions, PayloadAccess
from .pointers import (
    FailureStreak,
    S3Pointer,
    message_size,
    new_key,
    over_read_limit,
    refusal,
    should_offload,
    size_attribute,
)

__all__ = ["PayloadRefused", "PayloadStore", "PayloadUnavailable"]

logger = get_logger(__name__)

class PayloadUnavailable(Exception):
    """An offloaded body could not be read; the message is left to SQS."""

    def __init__(self, pointer: S3Pointer, code: str) -> None:
        super().__init__(f"{pointer}: {code}")
        self.pointer = pointer
        self.code = code


class PayloadRefused(PayloadUnavailable):
    """A pointer the options do not let the worker follow; its object is not touched."""


class PayloadStore:
    """Bodies in S3 for one connection's options.

    Without options (no ``large_payload_bucket``) nothing is offloaded. Pointers are
    read only in the buckets ``access`` names (by default the options' bucket): never
    handed to Celery, which would take one for a malformed message and drop it.
    """

    def __init__(
        self, options: LargePayloadOptions | None, access: PayloadAccess | None = None
    ) -> None:
        self.options = options
        self.access = access or PayloadAccess(frozenset({options.bucket} if options else ()))
        self._lock = threading.Lock()
        self._reads = FailureStreak()

    def offload(
        self, sqs_client: BaseClient, params: dict[str, Any], queue_url: str | None = None
    ) -> Owned | None:
        """A SendMessage's (or a batch entry's) large body put in S3, the pointer in its place.

        Returns the object put, for the caller to delete if SQS does not take the
        message (:mod:`celery_sqs_heartbeat.payloads.orphans`); None if nothing was. A
        body at or under the threshold is left as it is, byte for byte. A failed put
        raises to the producer, like a failed send: nothing was sent. ``queue_url``: for a
        batch entry, which has no ``QueueUrl`` of its own.
        """
        body = params.get("MessageBody")
        attributes = params.get("MessageAttributes") or {}
        if self.options is None or not isinstance(body, str):
            return None
        size = message_size(body, attributes)
        if not should_offload(size, self.options.threshold):
            return None
        pointer = S3Pointer(self.options.bucket, new_key(self.options.prefix))
        encoded = body.encode("utf-8")
        owner = self.access.owner_for(queue_url or params.get("QueueUrl"))
        this_process().clients.s3(sqs_client).put_object(
            Bucket=pointer.bucket,
            Key=pointer.key,
            Body=encoded,
            **owned_by(owner),
            **_encryption(self.options),
        )
        params["MessageBody"] = pointer.body()
        params["MessageAttributes"] = {**attributes, **size_attribute(len(encoded))}
        return pointer, owner

    def fetch(
        self,
        sqs_client: BaseClient,
        pointer: S3Pointer,
        size: int | None = None,
        queue_url: str | None = None,
    ) -> str:
        """The body behind ``pointer``; :class:`PayloadUnavailable` if S3 would not give it.

        :class:`PayloadRefused`, before any call, for a pointer the options do not let
        the worker follow, or whose claimed ``size`` is over the limit; and for an object
        whose length is, before its stream is read. The caller logs refusals. Failures
        are logged once per streak, naming the object, never the body.
        """
        access = self.access
        refused = refusal(pointer, access.readable, access.max_read_bytes, size)
        if refused is not None:
            raise PayloadRefused(pointer, refused)
        try:
            answer = this_process().clients.s3(sqs_client).get_object(
                Bucket=pointer.bucket,
                Key=pointer.key,
                **owned_by(access.owner_for(queue_url)),
            )
            body = _read_at_most(pointer, answer, access.max_read_bytes).decode("utf-8")
        except (ClientError, BotoCoreError, OSError, UnicodeDecodeError) as exc:
            code = error_name(exc)
            with self._lock:
                first = self._reads.failed()
            if first:
                logger.warning(
                    "Cannot read the body of a large message from %s (%s); the message is "
                    "left to SQS, released with a backoff, and read again on its next "
                    "receive. Further failures are not logged until a read succeeds.",
                    pointer,
                    code,
                )
            raise PayloadUnavailable(pointer, code) from None
        with self._lock:
            ended = self._reads.succeeded()
        if ended:
            logger.warning("Large message bodies are read from S3 again (%d reads failed)", ended)
        return body

    def remember(self, lease: Lease, pointer: S3Pointer, queue_url: str | None = None) -> None:
        """The object to delete once SQS confirms the delete of ``lease``'s message.

        Only an object that was read, so in a bucket the options name.
        """
        if self.options is None or not self.options.keep_objects:
            this_process().s3_cleanup.remember(lease, (pointer, self.access.owner_for(queue_url)))


def _read_at_most(pointer: S3Pointer, answer: Mapping[str, Any], max_bytes: int) -> bytes:
    """The object's bytes, refused unread if S3 says it is too large, or if it is.

    A length that lies (a stream longer than its ContentLength) gets no more in: the
    stream is read one byte past the limit at most.
    """
    stream = answer["Body"]
    length = answer.get("ContentLength")
    if isinstance(length, int) and length > max_bytes:
        stream.close()
        raise PayloadRefused(pointer, over_read_limit(length, max_bytes))
    data: bytes = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        stream.close()
        raise PayloadRefused(pointer, over_read_limit(len(data), max_bytes))
    return data


def _encryption(options: LargePayloadOptions) -> dict[str, str]:
    if options.sse is None:
        return {}
    key = {"SSEKMSKeyId": options.kms_key_id} if options.kms_key_id else {}
    return {"ServerSideEncryption": options.sse, **key}
