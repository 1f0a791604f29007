"""S3 objects no message points at: those put for messages SQS did not take.

A large body is put in S3 before the pointer to it is sent
(:meth:`~celery_sqs_heartbeat.payloads.store.PayloadStore.offload`). When SQS then does
not take the message (a 5xx after every retry, a refusal), no worker will ever read or
delete the object, and a producer that tries again puts another. So the object is
deleted as soon as the failure is known, before the caller hears of it, so that a
script that ends on the error leaves nothing behind: a SendMessage's in botocore's hooks
of that call (:mod:`celery_sqs_heartbeat.payloads.sending`), a batch entry's on the
sending thread, before its scope is told
(:class:`~celery_sqs_heartbeat.publishing.publisher.BatchPublisher`).

Only objects of messages SQS surely does not hold come here: a message whose send got
no answer may be in SQS, and needs its object. Those, and the objects of deletes that
fail here, stay until the bucket's lifecycle rule removes them. A failure is logged,
naming the objects, and never raised: the caller gets SQS's error, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from botocore.client import BaseClient
from botocore.exceptions import BotoCoreError, ClientError
from celery.utils.log import get_logger

from .cleanup import S3_DELETE_BATCH, Owned, by_bucket, error_name, owned_by

__all__ = ["discard"]

logger = get_logger(__name__)


def discard(s3_client: Callable[[], BaseClient], objects: Iterable[Owned]) -> None:
    """Delete ``objects`` now, in DeleteObjects calls through ``s3_client()``; never raises.

    An error nobody foresaw (S3's and the network's are handled per call), making the
    client included, is logged too: raised here, it would take the place of SQS's error
    for the caller.
    """
    owned = list(objects)
    try:
        s3 = s3_client()
        for (bucket, owner), keys in by_bucket(owned).items():
            for start in range(0, len(keys), S3_DELETE_BATCH):
                _delete(s3, bucket, owner, keys[start : start + S3_DELETE_BATCH])
    except Exception:
        logger.exception(
            "Deleting the S3 object(s) of %d message(s) SQS did not take failed: %s",
            len(owned),
            ", ".join(str(pointer) for pointer, _ in owned),
        )


def _delete(s3: BaseClient, bucket: str, owner: str | None, keys: Sequence[str]) -> None:
    try:
        answer = s3.delete_objects(
            Bucket=bucket,
            Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True},
            **owned_by(owner),
        )
        failed = {str(e.get("Key")): str(e.get("Code", "?")) for e in answer.get("Errors") or []}
    except (ClientError, BotoCoreError, OSError) as exc:
        failed = dict.fromkeys(keys, error_name(exc))
    if failed:
        logger.warning(
            "Cannot delete the S3 object(s) of %d message(s) SQS did not take, in bucket "
            "%s: %s; they stay until the bucket's lifecycle rule removes them",
            len(failed),
            bucket,
            ", ".join(f"{key} ({code})" for key, code in failed.items()),
        )
