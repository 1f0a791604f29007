"""Message bodies too large for SQS, kept in S3: the format and the decisions, no I/O.

SQS refuses a message over the queue's ``MaximumMessageSize`` (at most 1 MiB, 256 KiB
on queues never raised), and kombu base64-encodes the body, so a task's arguments hit
the limit at about three quarters of it. Such a body is stored as an S3 object and SQS
carries a pointer to it, in the format of AWS's extended clients (Java, Python's
``amazon-sqs-extended-client``, .NET), so that either side may be one of them:

- the body ``["software.amazon.payloadoffloading.PayloadS3Pointer",
  {"s3BucketName": ..., "s3Key": ...}]``;
- the message attribute ``ExtendedPayloadSize`` (Number): the original body's size in
  bytes; older clients wrote ``SQSLargePayloadSize`` and ``MessageS3Pointer``, which are
  read too.

The S3 object holds the original body, as UTF-8 text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_THRESHOLD",
    "POINTER_CLASS",
    "SIZE_ATTRIBUTE",
    "FailureStreak",
    "S3Pointer",
    "message_size",
    "new_key",
    "pointer_in",
    "refusal",
    "should_offload",
    "size_in",
    "unavailable_release_delay",
]

#: The pointer's class name as AWS's current clients write it.
POINTER_CLASS = "software.amazon.payloadoffloading.PayloadS3Pointer"
#: As the Java extended client wrote it before the payload-offloading library.
LEGACY_POINTER_CLASS = "com.amazon.sqs.javamessaging.MessageS3Pointer"
#: The attribute that marks an offloaded message, holding the original size.
SIZE_ATTRIBUTE = "ExtendedPayloadSize"
LEGACY_SIZE_ATTRIBUTE = "SQSLargePayloadSize"

#: AWS's extended clients offload from this size (body and attributes, in bytes): the
#: old 256 KiB limit of SQS, which queues never raised still have.
DEFAULT_THRESHOLD = 262_144

#: The longest a message whose object could not be read waits before it is seen again.
MAX_UNAVAILABLE_DELAY = 300


@dataclass(frozen=True)
class S3Pointer:
    """Where an offloaded body is."""

    bucket: str
    key: str

    def body(self) -> str:
        """The SQS body that stands for the object, as AWS's clients write it."""
        return json.dumps([POINTER_CLASS, {"s3BucketName": self.bucket, "s3Key": self.key}])

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def pointer_in(body: str | bytes) -> S3Pointer | None:
    """The pointer an SQS body claims to be, or None for any other body.

    A kombu message is a JSON object (base64-encoded by default), never a JSON array
    starting with a pointer class, so the body alone tells: the size attribute, which a
    receive gets only if it asks for it, is not needed. A pointer whose bucket or key is
    missing is still one, with that part empty, for :func:`refusal` to refuse: handed
    to Celery, it would be deleted as an unknown message, leaving nothing to look at.
    """
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    if not text.lstrip().startswith("["):
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    if not (
        isinstance(parsed, list)
        and len(parsed) == 2
        and parsed[0] in (POINTER_CLASS, LEGACY_POINTER_CLASS)
        and isinstance(parsed[1], dict)
    ):
        return None
    bucket, key = parsed[1].get("s3BucketName"), parsed[1].get("s3Key")
    return S3Pointer(bucket if isinstance(bucket, str) else "", key if isinstance(key, str) else "")


def size_in(attributes: Mapping[str, Mapping[str, Any]] | None) -> int | None:
    """The original body's size a pointer's message attribute claims, if it has one.

    A claim only, which anyone who can send may make: :func:`refusal` uses it to refuse
    early, and the object's own length is checked again when it is read.
    """
    for name in (SIZE_ATTRIBUTE, LEGACY_SIZE_ATTRIBUTE):
        value = (attributes or {}).get(name, {}).get("StringValue")
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
    return None


def refusal(
    pointer: S3Pointer, readable: Collection[str], max_bytes: int, size: int | None
) -> str | None:
    """Why a worker must not follow ``pointer``, or None if it may read the object.

    Anyone who may send to a task queue can write a pointer: a worker that followed any
    of them would read, and after the ack delete, whatever object its role may touch.
    So only the buckets the options name are read, and no body over the size limit.
    """
    if not (pointer.bucket and pointer.key):
        return "the pointer names no bucket or no key"
    if pointer.bucket not in readable:
        return (
            f"bucket {pointer.bucket} is neither large_payload_bucket nor in "
            "large_payload_read_buckets"
        )
    if size is not None and size > max_bytes:
        return over_read_limit(size, max_bytes)
    return None


def over_read_limit(size: int, max_bytes: int) -> str:
    """The refusal of a body of ``size`` bytes, claimed or found while reading it."""
    return f"{size} bytes, over large_payload_max_read_bytes ({max_bytes})"


def message_size(body: str, attributes: Mapping[str, Mapping[str, Any]] | None = None) -> int:
    """The size SQS counts against its limit: the body's bytes and the attributes'.

    As AWS's extended clients count it: each attribute's name, data type and value.
    """
    size = len(body.encode("utf-8"))
    for name, attribute in (attributes or {}).items():
        size += len(name.encode("utf-8"))
        for part in ("DataType", "StringValue"):
            value = attribute.get(part)
            if value:
                size += len(str(value).encode("utf-8"))
        binary = attribute.get("BinaryValue")
        if binary:
            size += len(binary)
    return size


def should_offload(size: int, threshold: int | None) -> bool:
    """Whether a message of ``size`` bytes goes through S3; None means always."""
    return threshold is None or size > threshold


def size_attribute(original_size: int) -> dict[str, dict[str, str]]:
    """The message attribute that marks an offloaded message for AWS's clients."""
    return {SIZE_ATTRIBUTE: {"DataType": "Number", "StringValue": str(original_size)}}


def new_key(prefix: str, make_id: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    """A fresh object key: the prefix and a random UUID, as AWS's clients name them."""
    return f"{prefix}{make_id()}"


def unavailable_release_delay(receive_count: int) -> int:
    """Seconds before a message whose object could not be read is seen again.

    Doubling with SQS's own receive count (1, 2, 4, ... up to 5 minutes), so the
    backoff survives the worker, and a redrive policy ends the retries of an object
    that is gone for good.
    """
    exponent = min(max(receive_count, 1) - 1, 16)
    return int(min(2**exponent, MAX_UNAVAILABLE_DELAY))


@dataclass
class FailureStreak:
    """S3 failing, said once per streak rather than once per message.

    Each message whose object cannot be read is released; a log line for each would
    flood the log for as long as S3 is down. :meth:`failed` is True for the first
    failure of a streak, :meth:`succeeded` for the first success after one, with how
    many failed meanwhile.
    """

    failures: int = 0

    def failed(self) -> bool:
        self.failures += 1
        return self.failures == 1

    def succeeded(self) -> int:
        """How many failed in the streak that this success ends (0: there was none)."""
        ended, self.failures = self.failures, 0
        return ended
