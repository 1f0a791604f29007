"""AWS's ``amazon-sqs-extended-client`` on one side of a queue, in a process of its own.

Importing the library replaces ``boto3.Session`` for the whole process, so it never runs
in the tests' own process. ``python -m tests.integration.extended_client send URL BUCKET``
sends stdin's text as a message body; ``receive URL`` prints the body of one message,
read back from S3 by the library. The endpoint is ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def client() -> Any:
    from sqs_extended_client import SQSExtendedClientSession

    session = SQSExtendedClientSession(region_name="us-east-1")
    return session.client("sqs", endpoint_url=os.environ["AWS_ENDPOINT_URL"])


def main(command: str, queue_url: str, bucket: str = "") -> None:
    sqs = client()
    if command == "send":
        sqs.large_payload_support = bucket
        sqs.send_message(QueueUrl=queue_url, MessageBody=sys.stdin.read())
        return
    messages = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=1, WaitTimeSeconds=5, VisibilityTimeout=30
    ).get("Messages", [])
    sys.stdout.write(messages[0]["Body"] if messages else "")


if __name__ == "__main__":
    main(*sys.argv[1:])
