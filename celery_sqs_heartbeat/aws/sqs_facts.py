"""What SQS decides, not this package: its limits, what its error codes mean, FIFO names.

Written once, here, because copies drift: the queue-missing codes were listed twice and
the prefix of SQS's codes stripped three times, and when LocalStack answered a deleted
message with ``InvalidParameterValueException`` instead of SQS's
``InvalidParameterValue``, the renewals took it for a passing fault and retried it for
a whole lease before reporting the lease lost. Pure, no I/O, nothing else imported.

An error code in none of the families below is *transient*: worth asking again. That is
the safe reading of a code this module does not know, since a retry costs one call,
while a lease taken for lost lets SQS hand its running task to another worker. Except
where a retry is a worker waiting for SQS instead of stopping: there only the answers
that say "later" are waited out (:func:`says_retry_later`).
"""

from __future__ import annotations

import re

__all__ = [
    "FATAL_CODES",
    "LOST_LEASE_CODES",
    "MAX_MESSAGE_SIZE_ATTRIBUTE",
    "QUEUE_DELETED_RECENTLY",
    "QUEUE_MISSING_CODES",
    "RECEIVE_COUNT_ATTRIBUTE",
    "SEND_REFUSED_CODES",
    "SNS_NOT_FOUND",
    "SQS_BATCH_SIZE",
    "SQS_MAX_BATCH_SEND_SIZE",
    "SQS_MAX_DELAY_SECONDS",
    "SQS_MAX_HOLD_SECONDS",
    "SQS_MAX_IN_FLIGHT",
    "SQS_MAX_MESSAGES",
    "SQS_MAX_MESSAGE_SIZE",
    "SQS_MAX_RETENTION_SECONDS",
    "SQS_MIN_RETENTION_SECONDS",
    "SQS_QUEUE_NAME_REUSE_SECONDS",
    "THROTTLING_CODES",
    "aws_queue_account",
    "canonical_code",
    "error_code",
    "is_beyond_hold_limit",
    "is_fifo",
    "says_retry_later",
]

#: ChangeMessageVisibilityBatch and DeleteMessageBatch take at most ten entries; SQS
#: refuses a longer call whole (``TooManyEntriesInBatchRequest``), so callers cut them.
SQS_BATCH_SIZE = 10

#: ReceiveMessage returns at most ten messages (``MaxNumberOfMessages`` is 1 to 10).
SQS_MAX_MESSAGES = 10

#: The largest message SQS takes, body and attributes, in bytes (1 MiB since August 2025;
#: a queue's ``MaximumMessageSize`` may be lower, 256 KiB on queues never raised).
SQS_MAX_MESSAGE_SIZE = 1_048_576

#: SendMessageBatch takes at most this many bytes in all, every message's body and
#: attributes summed (SQS refuses a longer call whole: ``BatchRequestTooLong``). The
#: same 1 MiB as one message, so a message SQS takes alone always fits a call alone.
SQS_MAX_BATCH_SEND_SIZE = SQS_MAX_MESSAGE_SIZE

#: The queue attribute holding the largest message the queue takes (1 KiB to 1 MiB; 1 MiB,
#: :data:`SQS_MAX_MESSAGE_SIZE`, on a queue created without it). A message past it is
#: refused, and in a SendMessageBatch SQS may refuse the whole call naming no entry.
MAX_MESSAGE_SIZE_ATTRIBUTE = "MaximumMessageSize"

#: SQS never keeps a message invisible for longer than 12 hours after one receive: a
#: visibility timeout above this is refused, and renewals cannot push past it either.
SQS_MAX_HOLD_SECONDS = 43_200

#: The message attribute in which SQS counts the receives of a message, this one included.
RECEIVE_COUNT_ATTRIBUTE = "ApproximateReceiveCount"

#: The longest a message sent to a standard queue may wait before it is first visible
#: (``DelaySeconds``); FIFO queues take no per-message delay at all.
SQS_MAX_DELAY_SECONDS = 900

#: The shortest and longest a queue may keep a message (its ``MessageRetentionPeriod``,
#: one minute to 14 days); CreateQueue refuses a value outside them.
SQS_MIN_RETENTION_SECONDS = 60
SQS_MAX_RETENTION_SECONDS = 1_209_600

#: After a queue is deleted, SQS refuses for this long to create a queue of the same
#: name (``QueueDeletedRecently``): a name that comes back (a worker's mailbox, a
#: remote-control reply queue) must not be deleted while it may be declared again.
SQS_QUEUE_NAME_REUSE_SECONDS = 60

#: Messages a standard queue may have in flight (received, neither deleted nor visible
#: again); past it ReceiveMessage answers ``OverLimit``. One worker may hold them all, so
#: it is the number of leases the book and the renewal thread are sized for.
SQS_MAX_IN_FLIGHT = 120_000

#: Per-entry codes saying the receipt handle no longer holds the message: it was
#: deleted, received again, or its visibility ran out (SQS words an expired handle as
#: ``InvalidParameterValue``). Asking again cannot help. Except that SQS gives the same
#: code to a visibility past its 12 hours: :func:`is_beyond_hold_limit` tells that apart.
LOST_LEASE_CODES = frozenset(
    {"MessageNotInflight", "ReceiptHandleIsInvalid", "InvalidParameterValue"}
)

#: What SQS's refusal of a visibility past its 12 hours says, and no other of its errors:
#: "Value 43200 for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout
#: for the message is beyond the limit [43200 seconds]" (moto copies the wording).
BEYOND_HOLD_LIMIT_WORDS = "beyond the limit"

#: Whole-call codes saying the queue is gone: ``NonExistentQueue`` in the query protocol
#: (and the JSON protocol's query-compatible header), ``QueueDoesNotExist`` as the JSON
#: protocol's ``__type`` and boto3's exception name.
QUEUE_MISSING_CODES = frozenset({"NonExistentQueue", "QueueDoesNotExist"})

#: SNS's answer for a topic or subscription that does not exist (SQS's fanout partner:
#: ListSubscriptionsByTopic of a topic never made, Unsubscribe of one removed already).
SNS_NOT_FOUND = "NotFound"

#: CreateQueue's refusal of a name deleted less than ``SQS_QUEUE_NAME_REUSE_SECONDS`` ago.
QUEUE_DELETED_RECENTLY = "QueueDeletedRecently"

#: Answers that no retry of a receive can change: the worker's identity, permissions or
#: queue are wrong, and retrying would only hide the mistake.
FATAL_CODES = QUEUE_MISSING_CODES | frozenset(
    {
        "AccessDenied",
        "InvalidClientTokenId",
        "UnrecognizedClient",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "MissingAuthenticationToken",
        "InvalidSecurity",
        "InvalidAddress",
        "OptInRequired",
        "KmsAccessDenied",
        "KmsDisabled",
        "KmsInvalidKeyUsage",
        "KmsInvalidState",
        "KmsNotFound",
        "KmsOptInRequired",
    }
)


#: Codes by which SQS (or KMS behind it) asks the caller to slow down: worth asking
#: again, later. SQS words them differently by protocol and age (``Throttling`` in the
#: query protocol, ``ThrottlingException`` in JSON, ``RequestThrottled`` per entry).
THROTTLING_CODES = frozenset({"Throttling", "RequestThrottled", "KmsThrottled"})

#: The HTTP status of too many requests: SNS's throttling (``Throttled``) answers with it.
HTTP_TOO_MANY_REQUESTS = 429

#: From this HTTP status on, the fault is the service's own (``InternalError`` 500,
#: ``ServiceUnavailable`` 503), not the call's.
HTTP_SERVER_ERROR = 500

#: Codes that refuse a message to be sent, whole call or one entry, for good: the same
#: message would be refused again. Anything else is worth another try, like an unknown
#: code elsewhere: a retry costs one call, a message given up costs a task.
SEND_REFUSED_CODES = FATAL_CODES | frozenset(
    {
        "InvalidParameterValue",
        "InvalidMessageContents",
        "MissingParameter",
        "UnsupportedOperation",
        "InvalidAttributeName",
        "InvalidAttributeValue",
        "BatchRequestTooLong",
        "MessageTooLong",
        "TooManyEntriesInBatchRequest",
        "BatchEntryIdsNotDistinct",
        "InvalidBatchEntryId",
        "EmptyBatchRequest",
    }
)


def error_code(raw: str | None) -> str:
    """The code as logs and counters show it: without the wrapping its protocol adds.

    The query protocol, and the header botocore reads in the JSON protocol, write
    ``AWS.SimpleQueueService.NonExistentQueue``; a JSON body (which kombu's asynchronous
    client hands over raw) writes ``com.amazonaws.sqs#QueueDoesNotExist``, or
    ``com.amazon.coral.service#UnrecognizedClientException`` for AWS's front end. The
    name after the last ``#`` or ``.`` is the same code in every one of them.
    """
    return (raw or "Unknown").rsplit("#", 1)[-1].rsplit(".", 1)[-1]


def canonical_code(raw: str | None) -> str:
    """The code as the families above write it: :func:`error_code` less an ``Exception``.

    The same answer comes with and without the suffix: ``AccessDeniedException`` in
    AWS's JSON protocol is ``AccessDenied`` in the query protocol, and LocalStack's
    ``InvalidParameterValueException`` is SQS's ``InvalidParameterValue``. No code of
    SQS's model differs from another by the suffix alone, so the strip merges nothing
    else. Only for comparing: logs and counters keep the code as it came.
    """
    return error_code(raw).removesuffix("Exception")


def says_retry_later(code: str | None, http_status: int | None) -> bool:
    """Whether an error answer says the same call may work later: a 5xx, or a throttle.

    Narrower than this module's reading of an unknown code as transient, on purpose:
    where a retry is not one more call but a worker that waits for SQS instead of
    stopping (a channel being set up), only the answers that say "later" in so many
    words are waited out: the service's own fault, and its requests to slow down
    (:data:`THROTTLING_CODES`, or HTTP 429). A code of :data:`FATAL_CODES` never is,
    whatever its status: retrying a mistake of the configuration would only hide it.
    """
    canonical = canonical_code(code)
    if canonical in FATAL_CODES:
        return False
    status = http_status or 0
    return (
        canonical in THROTTLING_CODES
        or status == HTTP_TOO_MANY_REQUESTS
        or status >= HTTP_SERVER_ERROR
    )


def is_beyond_hold_limit(code: str | None, message: str | None) -> bool:
    """Whether SQS refused a visibility change as ending past 12 hours from the receive.

    SQS answers that, and an expired receipt handle, with one code,
    ``InvalidParameterValue``; only the message tells them apart. The difference matters:
    an expired handle means the message may already be another worker's (a lost lease),
    while this refusal leaves the handle good and only the visibility asked too long.
    """
    return (
        canonical_code(code) == "InvalidParameterValue"
        and BEYOND_HOLD_LIMIT_WORDS in (message or "").casefold()
    )


def is_fifo(queue_name: str) -> bool:
    """Whether the queue keeps its message groups in order.

    SQS requires a FIFO queue's name to end in ``.fifo`` and allows no dot in any other
    queue's name, so the name tells without a GetQueueAttributes call.
    """
    return queue_name.endswith(".fifo")


#: An AWS queue URL: ``https://sqs.<region>.amazonaws.com[.cn]/<12-digit account>/<name>``
#: (or the older ``https://<region>.queue.amazonaws.com/...``).
_AWS_QUEUE_URL = re.compile(r"https://[a-z0-9.-]+\.amazonaws\.com(?:\.cn)?/(\d{12})/[^/]+")


def aws_queue_account(queue_url: str | None) -> str | None:
    """The account that owns an AWS queue, from its URL; None for any other endpoint.

    A local server's URLs carry an account too (moto's 123456789012), which names
    nobody's buckets, hence AWS's host only.
    """
    found = _AWS_QUEUE_URL.fullmatch(queue_url or "")
    return found.group(1) if found else None
