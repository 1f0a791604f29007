"""Servers that enforce IAM: the users and roles made on them first, clients signed with
their keys, the policies of docs/iam.md, and what moto's request recorder saw.

The ``enforced`` fixture (conftest.py) starts a server of each module's own through
:func:`enforcing` and hands its :class:`Iam` to the module's ``iam_setup``.
"""

from __future__ import annotations

import base64
import calendar
import json
import re
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from celery_sqs_heartbeat.testing import StrictSQSServer
from celery_sqs_heartbeat.testing.s3_protocol import identify_s3_call
from tests.integration.harness import REPO

#: An access key ID and its secret key.
Keys = tuple[str, str]
#: moto's account: the one whose users, roles and queues the server knows.
ACCOUNT_ID = "123456789012"
#: One try a call: a refused call is refused once, not retried into the counts.
NO_RETRIES = Config(retries={"mode": "standard", "total_max_attempts": 1})
POLICIES_PAGE = REPO / "docs" / "iam.md"


def published_policy(role: str) -> dict[str, Any]:
    """The policy document that follows ``<!-- iam-policy: ROLE -->`` in docs/iam.md."""
    page = POLICIES_PAGE.read_text()
    marker = f"<!-- iam-policy: {role} -->"
    assert page.count(marker) == 1, f"docs/iam.md must hold {marker} exactly once"
    block = re.match(r"\s*```json\n(.*?)\n```", page.split(marker, 1)[1], re.DOTALL)
    assert block is not None, f"no ```json block right after {marker}"
    text = block.group(1).replace("REGION", StrictSQSServer.REGION)
    document: dict[str, Any] = json.loads(text.replace("ACCOUNT_ID", ACCOUNT_ID))
    return document


def without_action(policy: dict[str, Any], action: str) -> dict[str, Any]:
    """``policy`` less one action; a statement left with no action goes, as IAM wants."""
    statements = []
    for statement in policy["Statement"]:
        actions = statement["Action"]
        actions = [actions] if isinstance(actions, str) else actions
        kept = [a for a in actions if a != action]
        if kept:
            statements.append({**statement, "Action": kept})
    assert statements != policy["Statement"], f"{action} is not in the policy"
    return {**policy, "Statement": statements}


def allow(actions: list[str] | str, resource: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": actions, "Resource": resource}],
    }


def client(server: StrictSQSServer, service: str, keys: Keys, retries: bool = True) -> Any:
    """A boto3 client of ``server`` that signs with ``keys``; S3's path-style addressing."""
    config = server.s3_config if service == "s3" else Config()
    return boto3.client(
        service,
        endpoint_url=server.endpoint_url,
        region_name=StrictSQSServer.REGION,
        aws_access_key_id=keys[0],
        aws_secret_access_key=keys[1],
        config=config if retries else config.merge(NO_RETRIES),
    )


@dataclass
class Iam:
    """A server about to enforce IAM: what a module needs on it is made before :meth:`enforce`.

    Once IAM is enforced, the server's own key may no longer make users, queues or buckets.
    """

    server: StrictSQSServer
    recording: bool
    _iam: Any = field(init=False)

    def __post_init__(self) -> None:
        self._iam = boto3.client("iam", **self.server.boto3_kwargs)

    def admin(self, service: str) -> Any:
        """A client of the server's own key, allowed everything until :meth:`enforce`."""
        config = self.server.s3_config if service == "s3" else None
        return boto3.client(service, config=config, **self.server.boto3_kwargs)

    def user(self, name: str, *policies: dict[str, Any]) -> Keys:
        """A user with these inline policies; its access key."""
        self._iam.create_user(UserName=name)
        for number, policy in enumerate(policies):
            self._iam.put_user_policy(
                UserName=name, PolicyName=f"{name}-{number}", PolicyDocument=json.dumps(policy)
            )
        key = self._iam.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def role(self, name: str, assumed_by: str, policy: dict[str, Any]) -> str:
        """A role with ``policy`` that the user ``assumed_by`` may assume; its ARN."""
        trust = {
            "Effect": "Allow",
            "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT_ID}:user/{assumed_by}"},
            "Action": "sts:AssumeRole",
        }
        self._iam.create_role(
            RoleName=name,
            AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [trust]}),
        )
        self._iam.put_role_policy(RoleName=name, PolicyName=name, PolicyDocument=json.dumps(policy))
        return f"arn:aws:iam::{ACCOUNT_ID}:role/{name}"

    def enforce(self) -> None:
        """Enforce IAM; then, if recording, record every request from here on.

        moto writes its recording file at the first request recorded: one now, signed by a
        user of its own, so that any test of the module may read the recording first.
        """
        primer = (
            self.user("recording-primer", allow("sqs:ListQueues", "*")) if self.recording else None
        )
        self.server.enforce_iam()
        if primer is not None:
            moto_api(self.server, "POST", "start-recording")
            client(self.server, "sqs", primer).list_queues()


@contextmanager
def enforcing(recording: Path | None = None) -> Iterator[Iam]:
    """A server of its own, for a module: enforcement cannot be turned off, and would fail
    the other tests. With ``recording``, moto's recorder writes every request to that file."""
    with pytest.MonkeyPatch.context() as patch:
        if recording is not None:
            # Read by the server process at start; by default it would be written to the
            # working directory.
            patch.setenv("MOTO_RECORDER_FILEPATH", str(recording))
        patch.delenv("MOTO_ENABLE_RECORDING", raising=False)
        server = StrictSQSServer().start()
    try:
        yield Iam(server, recording is not None)
    finally:
        server.stop()


def moto_api(server: StrictSQSServer, method: str, route: str) -> str:
    """Call moto's request recorder (``/moto-api/recorder/ROUTE``), never through a proxy."""
    request = urllib.request.Request(
        f"{server.endpoint_url}/moto-api/recorder/{route}", method=method
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        return str(response.read().decode())


@dataclass(frozen=True)
class Call:
    """One request as the server received it, from moto's recorder."""

    service: str
    action: str
    access_key_id: str
    signed_at: float
    """From ``X-Amz-Date``: whole seconds."""
    has_session_token: bool
    queue_url: str | None
    visibilities: tuple[int, ...]
    """The VisibilityTimeout of each entry of a ChangeMessageVisibilityBatch."""
    objects: tuple[str, ...]
    """The S3 keys a GetObject or DeleteObjects call names."""


def recorded(server: StrictSQSServer) -> list[Call]:
    """Every AWS request since recording started, oldest first."""
    calls = []
    for line in moto_api(server, "GET", "download-recording").splitlines():
        try:
            calls.append(_parse_recorded(json.loads(line)))
        except ValueError:
            continue  # a line two threads interleaved: none seen so far
    return calls


def _parse_recorded(entry: dict[str, Any]) -> Call:
    headers = entry["headers"]
    body = entry.get("body") or ""
    raw = base64.b64decode(body) if entry.get("body_encoded") else body.encode()
    authorization = headers.get("Authorization", "")
    scope = authorization.partition("Credential=")[2].partition(",")[0].split("/")
    target = headers.get("X-Amz-Target", "")
    payload: dict[str, Any] = {}
    objects: tuple[str, ...] = ()
    if len(scope) > 3 and scope[3] == "s3":
        action, objects = _s3_call(entry, raw)
    elif target:
        action = target.rsplit(".", 1)[-1]
        payload = json.loads(raw or b"{}")
    else:
        form = urllib.parse.parse_qs(raw.decode("utf-8", "replace"))
        action = form.get("Action", [""])[0]
    signed = headers.get("X-Amz-Date", "")
    return Call(
        service=scope[3] if len(scope) > 3 else "",
        action=action,
        access_key_id=scope[0],
        signed_at=(
            float(calendar.timegm(time.strptime(signed, "%Y%m%dT%H%M%SZ"))) if signed else 0.0
        ),
        has_session_token="X-Amz-Security-Token" in headers,
        queue_url=payload.get("QueueUrl"),
        visibilities=tuple(e.get("VisibilityTimeout") for e in payload.get("Entries") or []),
        objects=objects,
    )


def _s3_call(entry: dict[str, Any], raw: bytes) -> tuple[str, tuple[str, ...]]:
    """The S3 action, named as the strict server names it, and the keys it names."""
    url = urllib.parse.urlsplit(entry["url"])
    action = identify_s3_call(
        {
            "REQUEST_METHOD": entry["method"],
            "PATH_INFO": url.path,
            "QUERY_STRING": url.query,
            "HTTP_AUTHORIZATION": entry["headers"].get("Authorization", ""),
        }
    )
    if action == "s3:DeleteObjects":
        keys = ElementTree.fromstring(raw).iterfind(".//{*}Object/{*}Key")
        return action, tuple(key.text or "" for key in keys)
    bucket_and_key = urllib.parse.unquote(url.path).lstrip("/").split("/", 1)
    return action or "", tuple(bucket_and_key[1:])
