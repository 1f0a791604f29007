"""S3's REST protocol, as far as the strict server must name and fail S3 calls itself.

moto serves S3 on the same port as SQS (path-style addressing: ``/bucket/key``), so the
server sees S3 calls too. It names them ``s3:<Operation>`` (``s3:GetObject``,
``s3:DeleteObjects``) for the counts, the call log and the faults, and answers an
injected fault with S3's own XML error, which botocore reads as S3's error code.
"""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

S3_PREFIX = "s3:"
"""What every S3 action name starts with; no SQS action has a colon."""

#: SQS's error code of a fault, and S3's answer for the same fault.
_S3_ERRORS = {
    "Throttling": ("503 Slow Down", "SlowDown"),
    "InternalError": ("500 Internal Server Error", "InternalError"),
    "AccessDenied": ("403 Forbidden", "AccessDenied"),
    "InvalidClientTokenId": ("403 Forbidden", "InvalidAccessKeyId"),
}

#: Operations on a bucket (no key), by method and the sub-resource in the query.
_BUCKET_OPERATIONS = {
    ("PUT", ""): "CreateBucket",
    ("DELETE", ""): "DeleteBucket",
    ("HEAD", ""): "HeadBucket",
    ("GET", ""): "ListObjects",
    ("POST", "delete"): "DeleteObjects",
    ("PUT", "lifecycle"): "PutBucketLifecycleConfiguration",
    ("GET", "lifecycle"): "GetBucketLifecycleConfiguration",
}
_OBJECT_OPERATIONS = {
    "PUT": "PutObject",
    "GET": "GetObject",
    "HEAD": "HeadObject",
    "DELETE": "DeleteObject",
}


def is_s3_action(action: str) -> bool:
    return action.startswith(S3_PREFIX)


def identify_s3_call(environ: WSGIEnvironment) -> str | None:
    """``s3:<Operation>`` if the request is signed for S3, else None.

    Only the requests an SQS transport and these tests make are named exactly; any
    other S3 request is ``s3:<METHOD>`` (e.g. ``s3:GET`` for ListBuckets).
    """
    if _signed_service(environ) != "s3":
        return None
    method = environ.get("REQUEST_METHOD", "")
    parts = environ.get("PATH_INFO", "").lstrip("/").split("/", 1)
    query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    if len(parts) == 2 and parts[1]:
        operation = _OBJECT_OPERATIONS.get(method)
    elif parts[0]:
        sub = next((name for name in ("delete", "lifecycle") if name in query), "")
        operation = _BUCKET_OPERATIONS.get((method, sub))
    else:
        operation = None
    return S3_PREFIX + (operation or method)


def _signed_service(environ: WSGIEnvironment) -> str:
    """The service of a SigV4 signature: ``Credential=KEY/DATE/REGION/SERVICE/aws4_request``."""
    authorization: str = environ.get("HTTP_AUTHORIZATION", "")
    credential = authorization.partition("Credential=")[2].partition(",")[0]
    if not credential:
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        credential = query.get("X-Amz-Credential", [""])[0]
    scope = credential.split("/")
    return scope[3] if len(scope) > 3 else ""


def s3_error(status: str, sqs_code: str, message: str, request_id: str) -> tuple[str, bytes]:
    """The status and XML body S3 answers for the fault SQS would answer with ``sqs_code``."""
    s3_status, code = _S3_ERRORS.get(sqs_code, (status, sqs_code))
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<RequestId>{request_id}</RequestId></Error>"
    ).encode()
    return s3_status, body
