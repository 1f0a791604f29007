"""The large-payload options: the S3 bucket that takes bodies too large for SQS.

Read beside :class:`~celery_sqs_heartbeat.options.HeartbeatOptions`, checked the same
way: a bad value stops the worker (or the producer) at start-up, naming the option.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .options import InvalidTransportOption, _boolean, _given, _numeric
from .payloads import DEFAULT_THRESHOLD
from .sqs_facts import SQS_MAX_MESSAGE_SIZE

__all__ = ["LargePayloadOptions"]

#: S3's rules for a bucket name (general purpose buckets): 3 to 63 characters, lower
#: case letters, digits, dots and hyphens, starting and ending with a letter or digit.
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")

#: S3 keys are at most 1,024 bytes; a key is the prefix and a 36-character UUID.
MAX_PREFIX_BYTES = 1024 - 36

ALWAYS = "always"


@dataclass(frozen=True)
class LargePayloadOptions:
    """Where bodies too large for SQS go, and from which size."""

    bucket: str
    prefix: str = ""
    #: Bytes (body and attributes) above which a message goes through S3; None: always.
    threshold: int | None = DEFAULT_THRESHOLD
    #: Leave objects in S3 after the message's delete (a lifecycle rule removes them).
    keep_objects: bool = False

    @classmethod
    def from_transport_options(cls, options: Mapping[str, Any]) -> LargePayloadOptions | None:
        """None when no bucket is set: bodies then go to SQS whatever their size."""
        bucket = _given(options, "large_payload_bucket", None)
        if bucket is None:
            return None
        if not isinstance(bucket, str) or not _BUCKET_NAME.fullmatch(bucket):
            raise InvalidTransportOption(
                f"large_payload_bucket={bucket!r}: must be an S3 bucket name (3 to 63 lower "
                "case letters, digits, dots and hyphens), or None to keep every body in SQS"
            )
        return cls(
            bucket=bucket,
            prefix=_prefix(options),
            threshold=_threshold(options),
            keep_objects=_boolean(options, "large_payload_keep_objects", False),
        )


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
