"""The large-payload options: the S3 bucket that takes bodies too large for SQS, and
which S3 objects a worker may read and delete.

Read beside :class:`~celery_sqs_heartbeat.options.HeartbeatOptions`, checked the same
way: a bad value stops the worker (or the producer) at start-up, naming the option.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..aws.sqs_facts import SQS_MAX_MESSAGE_SIZE, aws_queue_account
from ..options import InvalidTransportOption, _boolean, _given, _numeric
from .pointers import DEFAULT_THRESHOLD

__all__ = ["DEFAULT_MAX_READ_BYTES", "LargePayloadOptions", "PayloadAccess"]

#: S3's rules for a bucket name (general purpose buckets): 3 to 63 characters, lower
#: case letters, digits, dots and hyphens, starting and ending with a letter or digit.
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")

#: S3 keys are at most 1,024 bytes; a key is the prefix and a 36-character UUID.
MAX_PREFIX_BYTES = 1024 - 36

ALWAYS = "always"

#: The largest body a worker reads from S3 unless told otherwise: far over SQS's 1 MiB,
#: far under what would exhaust a worker's memory.
DEFAULT_MAX_READ_BYTES = 64 * 1024 * 1024
MAX_READ_BYTES_CEILING = 2**31

#: S3's server-side encryption of the objects put (``ServerSideEncryption``).
SSE_KMS = "aws:kms"
SSE_VALUES = ("AES256", SSE_KMS)

_ACCOUNT_ID = re.compile(r"\d{12}")


@dataclass(frozen=True)
class LargePayloadOptions:
    """Where bodies too large for SQS go, and from which size."""

    bucket: str
    prefix: str = ""
    #: Bytes (body and attributes) above which a message goes through S3; None: always.
    threshold: int | None = DEFAULT_THRESHOLD
    #: Leave objects in S3 after the message's delete (a lifecycle rule removes them).
    keep_objects: bool = False
    #: Server-side encryption of the objects put; None: the bucket's default.
    sse: str | None = None
    #: The KMS key of ``aws:kms``; None: S3's AWS managed key.
    kms_key_id: str | None = None

    @classmethod
    def from_transport_options(cls, options: Mapping[str, Any]) -> LargePayloadOptions | None:
        """None when no bucket is set: bodies then go to SQS whatever their size."""
        bucket = _bucket(options)
        sse, kms_key_id = _encryption(options)
        if bucket is None:
            return None
        return cls(
            bucket=bucket,
            prefix=_prefix(options),
            threshold=_threshold(options),
            keep_objects=_boolean(options, "large_payload_keep_objects", False),
            sse=sse,
            kms_key_id=kms_key_id,
        )


@dataclass(frozen=True)
class PayloadAccess:
    """Which S3 objects a worker reads (and deletes after the ack), and whose buckets.

    A pointer is only a claim, which anyone allowed to send to the queue may write; the
    options, not the message, say which buckets are the app's.
    """

    #: ``large_payload_bucket`` and ``large_payload_read_buckets``.
    readable: frozenset[str] = frozenset()
    max_read_bytes: int = DEFAULT_MAX_READ_BYTES
    #: ``large_payload_expected_bucket_owner`` as given.
    expected_owner: str | None = None
    #: Without one given: the account of an AWS queue's URL (False turns that off).
    owner_from_queue: bool = True

    @classmethod
    def from_transport_options(cls, options: Mapping[str, Any]) -> PayloadAccess:
        bucket = _bucket(options)
        owner = _given(options, "large_payload_expected_bucket_owner", None)
        if (
            owner is not None
            and owner is not False
            and not (isinstance(owner, str) and _ACCOUNT_ID.fullmatch(owner))
        ):
            raise InvalidTransportOption(
                f"large_payload_expected_bucket_owner={owner!r}: must be a 12-digit AWS "
                "account id, or False to name no owner (default: the queue URL's account)"
            )
        return cls(
            readable=frozenset(_read_buckets(options) | ({bucket} if bucket else set())),
            max_read_bytes=_max_read_bytes(options),
            expected_owner=owner or None,
            owner_from_queue=owner is not False,
        )

    def owner_for(self, queue_url: str | None) -> str | None:
        """The ``ExpectedBucketOwner`` of the S3 calls made for the queue at ``queue_url``."""
        if self.expected_owner is not None or not self.owner_from_queue:
            return self.expected_owner
        return aws_queue_account(queue_url)


def _bucket(options: Mapping[str, Any]) -> str | None:
    bucket = _given(options, "large_payload_bucket", None)
    if bucket is not None and not (isinstance(bucket, str) and _BUCKET_NAME.fullmatch(bucket)):
        raise InvalidTransportOption(
            f"large_payload_bucket={bucket!r}: must be an S3 bucket name (3 to 63 lower "
            "case letters, digits, dots and hyphens), or None to keep every body in SQS"
        )
    return bucket


def _read_buckets(options: Mapping[str, Any]) -> set[str]:
    given = _given(options, "large_payload_read_buckets", ())
    names = [n.strip() for n in given.split(",")] if isinstance(given, str) else given
    if not isinstance(names, (list, tuple, set, frozenset)) or not all(
        isinstance(name, str) and _BUCKET_NAME.fullmatch(name) for name in names
    ):
        raise InvalidTransportOption(
            f"large_payload_read_buckets={given!r}: must be a list of S3 bucket names (3 to "
            "63 lower case letters, digits, dots and hyphens), or a text of them separated "
            "by commas"
        )
    return set(names)


def _max_read_bytes(options: Mapping[str, Any]) -> int:
    given = _given(options, "large_payload_max_read_bytes", DEFAULT_MAX_READ_BYTES)
    value = _numeric(given)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        value = 0
    if not 1 <= value <= MAX_READ_BYTES_CEILING:
        raise InvalidTransportOption(
            f"large_payload_max_read_bytes={given!r}: must be a size in bytes, 1 to "
            f"{MAX_READ_BYTES_CEILING}"
        )
    return value


def _encryption(options: Mapping[str, Any]) -> tuple[str | None, str | None]:
    sse = _given(options, "large_payload_sse", None)
    if sse is not None and sse not in SSE_VALUES:
        raise InvalidTransportOption(
            f"large_payload_sse={sse!r}: must be 'AES256' or 'aws:kms', or None for the "
            "bucket's default encryption"
        )
    key = _given(options, "large_payload_kms_key_id", None)
    if key is not None and sse != SSE_KMS:
        raise InvalidTransportOption(
            f"large_payload_kms_key_id={key!r}: only with large_payload_sse 'aws:kms'"
        )
    if key is not None and not isinstance(key, str):
        raise InvalidTransportOption(
            f"large_payload_kms_key_id={key!r}: must be a KMS key id, ARN or alias"
        )
    return sse, key


def _prefix(options: Mapping[str, Any]) -> str:
    prefix = _given(options, "large_payload_prefix", "")
    if not isinstance(prefix, str) or len(prefix.encode("utf-8")) > MAX_PREFIX_BYTES:
        raise InvalidTransportOption(
            f"large_payload_prefix={prefix!r}: must be text of at most {MAX_PREFIX_BYTES} "
            "bytes (S3 keys are at most 1,024 bytes, 36 of them the key's UUID)"
        )
    return prefix


def _threshold(options: Mapping[str, Any]) -> int | None:
    given = _given(options, "large_payload_threshold", DEFAULT_THRESHOLD)
    if isinstance(given, str) and given.strip().lower() == ALWAYS:
        return None
    value = _numeric(given)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        value = -1
    if not 0 <= value < SQS_MAX_MESSAGE_SIZE:
        raise InvalidTransportOption(
            f"large_payload_threshold={given!r}: must be a size in bytes, 0 to "
            f"{SQS_MAX_MESSAGE_SIZE - 1} (SQS takes at most {SQS_MAX_MESSAGE_SIZE}), or "
            f"{ALWAYS!r} to send every body through S3"
        )
    return value
