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

import os
import queue
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import botocore.session
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from celery.utils.log import get_logger

from ..leasing.leases import Lease
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

__all__ = ["PayloadRefused", "PayloadStore", "PayloadUnavailable", "delete_objects_of"]

logger = get_logger(__name__)

#: A read that fails is not retried here: the message is released and read again on
#: its next receive, so the lease, which covers the read, is never held by a hung call.
S3_CLIENT_CONFIG = Config(
    connect_timeout=5,
    read_timeout=20,
    retries={"mode": "standard", "total_max_attempts": 2},
)
#: A local stack on an address has no bucket host names: path-style there.
LOCAL_STACK_CONFIG = Config(s3={"addressing_style": "path"})

#: DeleteObjects takes at most 1,000 keys a call.
S3_DELETE_BATCH = 1000

_s3_clients: weakref.WeakKeyDictionary[BaseClient, BaseClient] = weakref.WeakKeyDictionary()
_clients_lock = threading.Lock()

#: An object and its bucket's expected owner (None: not named).
Owned = tuple[S3Pointer, "str | None"]

#: The object of each held message read from S3, to delete once SQS confirms the
#: message's delete. Process-wide, like the leases: an ack may come through any channel,
#: and a lease that ends otherwise (released, lost) takes its entry with it.
_objects: weakref.WeakKeyDictionary[Lease, Owned] = weakref.WeakKeyDictionary()
_objects_lock = threading.Lock()
_deletes = FailureStreak()

#: Objects whose messages SQS confirmed deleted, waiting for the one thread that
#: deletes them (:func:`_delete_objects_in_turn`), started on first use.
ObjectDeletes = queue.SimpleQueue[tuple[Callable[[], BaseClient], list[Owned]]]
_object_deletes: ObjectDeletes = queue.SimpleQueue()
_deleter: threading.Thread | None = None


def _reset_at_fork() -> None:
    """Reset at fork: a child starts with no S3 client, no object to delete, new locks.

    A child has only the thread that forked. One of the parent's other threads may hold
    a lock at the fork, making an S3 client or noting an object: the child, a prefork
    pool process (a replaced one, ``max_tasks_per_child``), would wait on it for ever at
    its first offload. A client made in the parent shares its connection pools, sockets
    and all, with the child. The objects are those of the parent's messages, the
    parent's to delete, as the leases are the parent's to renew (the shared manager is
    reset at fork too); the delete failures the parent is counting are its own.
    """
    global _s3_clients, _clients_lock, _objects, _objects_lock, _deletes
    global _object_deletes, _deleter
    _s3_clients = weakref.WeakKeyDictionary()
    _clients_lock = threading.Lock()
    _objects = weakref.WeakKeyDictionary()
    _objects_lock = threading.Lock()
    _deletes = FailureStreak()
    _object_deletes = queue.SimpleQueue()
    _deleter = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_at_fork)


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
        self,
        sqs_client: BaseClient,
        params: dict[str, Any],
        queue_url: str | None = None,
        **_: Any,
    ) -> None:
        """botocore's ``provide-client-params`` hook of SendMessage: large bodies go to S3.

        A body at or under the threshold is left as it is, byte for byte. A failed put
        raises to the producer, like a failed send: nothing was sent. ``queue_url``: for a
        batch entry, which has no ``QueueUrl`` of its own.
        """
        body = params.get("MessageBody")
        attributes = params.get("MessageAttributes") or {}
        if self.options is None or not isinstance(body, str):
            return
        size = message_size(body, attributes)
        if not should_offload(size, self.options.threshold):
            return
        pointer = S3Pointer(self.options.bucket, new_key(self.options.prefix))
        encoded = body.encode("utf-8")
        owner = self.access.owner_for(queue_url or params.get("QueueUrl"))
        s3_client(sqs_client).put_object(
            Bucket=pointer.bucket,
            Key=pointer.key,
            Body=encoded,
            **_owned_by(owner),
            **_encryption(self.options),
        )
        params["MessageBody"] = pointer.body()
        params["MessageAttributes"] = {**attributes, **size_attribute(len(encoded))}

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
            answer = s3_client(sqs_client).get_object(
                Bucket=pointer.bucket,
                Key=pointer.key,
                **_owned_by(access.owner_for(queue_url)),
            )
            body = _read_at_most(pointer, answer, access.max_read_bytes).decode("utf-8")
        except (ClientError, BotoCoreError, OSError, UnicodeDecodeError) as exc:
            code = _code(exc)
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
            with _objects_lock:
                _objects[lease] = (pointer, self.access.owner_for(queue_url))


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


def _owned_by(owner: str | None) -> dict[str, str]:
    return {"ExpectedBucketOwner": owner} if owner else {}


def _encryption(options: LargePayloadOptions) -> dict[str, str]:
    if options.sse is None:
        return {}
    key = {"SSEKMSKeyId": options.kms_key_id} if options.kms_key_id else {}
    return {"ServerSideEncryption": options.sse, **key}


def delete_objects_of(client_source: Callable[[], BaseClient], leases: Iterable[Lease]) -> None:
    """SQS confirmed these deletes: their messages' objects go, in DeleteObjects calls.

    Never before: a message released, dead-lettered or lost keeps its object. Returns at
    once: the calls are made on a thread of their own, in turn, because this runs in the
    SQS delete's call slot, and a slow S3 must not hold the slots SQS's deletes need. A
    failure is logged once per streak and left: a bucket lifecycle rule removes what was
    not deleted (README), as it does what a process ending meanwhile leaves.
    """
    global _deleter
    with _objects_lock:
        owned = [o for lease in leases if (o := _objects.pop(lease, None))]
        if not owned:
            return
        _object_deletes.put((client_source, owned))
        if _deleter is None:
            _deleter = threading.Thread(
                target=_delete_objects_in_turn,
                args=(_object_deletes,),
                name="celery-sqs-heartbeat-s3-deletes",
                daemon=True,
            )
            _deleter.start()


def _delete_objects_in_turn(waiting: ObjectDeletes) -> None:
    """The deleting thread: one batch after another, for as long as the process lives.

    An error nobody foresaw (S3's and the network's are handled per call) is logged and
    the thread goes on: the objects stay for the lifecycle rule.
    """
    while True:
        client_source, owned = waiting.get()
        try:
            sqs_client = client_source()
            for (bucket, owner), keys in _by_bucket(owned).items():
                for start in range(0, len(keys), S3_DELETE_BATCH):
                    batch = keys[start : start + S3_DELETE_BATCH]
                    _delete_objects(sqs_client, bucket, owner, batch)
        except Exception:
            logger.exception("Deleting %d S3 object(s) of deleted messages failed", len(owned))


def _delete_objects(
    sqs_client: BaseClient, bucket: str, owner: str | None, keys: Sequence[str]
) -> None:
    try:
        answer = s3_client(sqs_client).delete_objects(
            Bucket=bucket,
            Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True},
            **_owned_by(owner),
        )
        errors = answer.get("Errors") or []
        code = errors[0].get("Code", "?") if errors else ""
    except (ClientError, BotoCoreError, OSError) as exc:
        code = _code(exc)
    with _objects_lock:
        first = _deletes.failed() if code else False
        ended = 0 if code else _deletes.succeeded()
    if first:
        logger.warning(
            "Cannot delete the objects of deleted large messages in bucket %s (%s); they "
            "stay until the bucket's lifecycle rule removes them. Further failures are not "
            "logged until a delete succeeds.",
            bucket,
            code,
        )
    elif ended:
        logger.warning(
            "Objects of deleted large messages are deleted again (%d calls failed)", ended
        )


def s3_client(sqs_client: BaseClient) -> BaseClient:
    """The S3 client that goes with a queue's SQS client, made once per SQS client.

    botocore has no public way to share credentials between clients, hence the signer,
    as in :func:`celery_sqs_heartbeat.aws.sqs_queue.renewal_client`.
    """
    with _clients_lock:
        made = _s3_clients.get(sqs_client)
        if made is None:
            endpoint = _s3_endpoint(sqs_client.meta.endpoint_url)
            config = (
                S3_CLIENT_CONFIG if endpoint is None else S3_CLIENT_CONFIG.merge(LOCAL_STACK_CONFIG)
            )
            made = botocore.session.Session().create_client(
                "s3",
                region_name=sqs_client.meta.region_name,
                endpoint_url=endpoint,
                config=config,
                aws_access_key_id="replaced-below",
                aws_secret_access_key="replaced-below",
            )
            made._request_signer._credentials = sqs_client._request_signer._credentials
            _s3_clients[sqs_client] = made
        return made


def _s3_endpoint(sqs_endpoint: str | None) -> str | None:
    """AWS's own S3 endpoint behind AWS's SQS; a local stack's own endpoint otherwise."""
    host = urlsplit(sqs_endpoint or "").hostname or ""
    if not host or host.endswith((".amazonaws.com", ".amazonaws.com.cn")):
        return None
    return sqs_endpoint


def _by_bucket(owned: Iterable[Owned]) -> Mapping[tuple[str, str | None], list[str]]:
    keys: defaultdict[tuple[str, str | None], list[str]] = defaultdict(list)
    for pointer, owner in owned:
        keys[pointer.bucket, owner].append(pointer.key)
    return keys


def _code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code") or exc)
    return type(exc).__name__
