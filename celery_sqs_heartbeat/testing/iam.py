"""IAM enforcement on the strict SQS server, so that a policy can be tested before AWS.

moto can enforce IAM, but two of its authorisation rules differ from AWS's in ways that
matter to an SQS consumer, and are fixed here: a batch call (e.g.
ChangeMessageVisibilityBatch) is authorised as its single action, since IAM has no
actions of its own for batches, and CreateQueue and GetQueueUrl are authorised on the ARN
of the queue they name (moto checks them against "*"). S3's DeleteObjects is authorised
as ``s3:DeleteObject`` on each key's ARN, as AWS does (moto checks the bucket's ARN, which
a policy scoped to a prefix never grants); a key denied there denies every key of the call,
which is stricter than AWS for a call that mixes keys. moto authorises every SNS call on
"*"; here it is authorised on the topic it names (by ARN, by name for CreateTopic, or
through a subscription's ARN), as AWS does, so that a policy scoped to topics can be
tested. moto does not ask for ``sns:TagResource`` when CreateTopic carries tags, as AWS
does. Every call the enforcement refuses is recorded, so that a test can tell which
permission a policy lacks.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

from .recorder import Refusal

if TYPE_CHECKING:
    from collections.abc import Callable

    from moto.sqs.responses import SQSResponse

    from .recorder import Recorder

_IAM_ACTIONS = {
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
    "DeleteMessageBatch": "DeleteMessage",
    "SendMessageBatch": "SendMessage",
}
"""The IAM action that authorises each SQS batch call: IAM has none of its own for them."""
_ACTIONS_ON_A_NAMED_QUEUE = frozenset({"CreateQueue", "GetQueueUrl"})


def install_iam_rules(recorder: Recorder) -> None:
    """Make moto's IAM enforcement authorise SQS calls as AWS does, and record its refusals.

    Nothing changes until :func:`enforce_iam`: before it, moto checks no call at all.
    """
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.s3.responses import S3Response
    from moto.sns.responses import SNSResponse
    from moto.sqs.responses import SQSResponse
    from werkzeug.exceptions import HTTPException

    original_resource = SQSResponse._determine_resource
    original_authorize = ActionAuthenticatorMixin._authenticate_and_authorize_action
    original_s3_authorize = S3Response._authenticate_and_authorize_s3_action

    def authorize_s3_by_key(
        response: Any, bucket_name: str | None = None, key_name: str | None = None
    ) -> None:
        keys: list[str | None] = [key_name]
        if bucket_name and key_name is None:
            keys = [*_keys_to_delete(response)] or keys
        for key in keys:
            original_s3_authorize(response, bucket_name=bucket_name, key_name=key)

    def determine_resource(response: SQSResponse) -> str:
        resource: str = _named_queue_arn(response) or original_resource(response)
        return resource

    def authorize_and_record(response: Any, iam_request_cls: type, resource: str = "*") -> None:
        try:
            original_authorize(response, iam_request_cls, resource)
        except HTTPException as refusal:
            recorder.record_refusal(_describe_refusal(response, refusal))
            raise

    patches: list[tuple[type, str, Callable[..., Any]]] = [
        (SQSResponse, "_authenticate_and_authorize_normal_action", _authorize_sqs_action),
        (SQSResponse, "_determine_resource", determine_resource),
        (ActionAuthenticatorMixin, "_authenticate_and_authorize_action", authorize_and_record),
        (S3Response, "_authenticate_and_authorize_s3_action", authorize_s3_by_key),
        (SNSResponse, "_determine_resource", _sns_topic_arn),
    ]
    for owner, name, function in patches:
        setattr(owner, name, function)


def enforce_iam() -> None:
    """moto checks every call once it has served this many unchecked ones; 0 is "now"."""
    from moto import settings

    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0


def _authorize_sqs_action(response: SQSResponse, resource: str = "*") -> None:
    # moto only calls the "class" it is given, so a factory does.
    response._authenticate_and_authorize_action(cast(Any, _sqs_iam_request), resource)


def _sqs_iam_request(*, action: str, **kwargs: Any) -> Any:
    """moto would ask for ``sqs:ChangeMessageVisibilityBatch``, which no policy grants."""
    from moto.iam.access_control import IAMRequest

    return IAMRequest(action=_IAM_ACTIONS.get(action, action), **kwargs)


def _keys_to_delete(response: Any) -> list[str]:
    """The keys of a DeleteObjects call (POST ``?delete``), or none for any other call."""
    import xml.etree.ElementTree as ElementTree

    if response.data.get("Action") != "DeleteObject" or not response.body:
        return []
    try:
        root = ElementTree.fromstring(response.body)
    except ElementTree.ParseError:
        return []
    return [node.text or "" for node in root.iter() if node.tag.rpartition("}")[2] == "Key"]


def _named_queue_arn(response: SQSResponse) -> str | None:
    """The queue CreateQueue or GetQueueUrl names, which moto resolves to "*".

    A policy that grants those two on the queues' ARNs, as AWS expects, would otherwise
    be refused.
    """
    from moto.utilities.utils import get_partition

    if response._get_action() not in _ACTIONS_ON_A_NAMED_QUEUE:
        return None
    name = response._get_param("QueueName")
    if not isinstance(name, str) or not name:
        return None
    account = response._get_param("QueueOwnerAWSAccountId") or response.current_account
    region = response.region
    return f"arn:{get_partition(region)}:sqs:{region}:{account}:{name}"


def _sns_topic_arn(response: Any) -> str:
    """The topic an SNS call acts on, which moto leaves as "*"."""
    from moto.utilities.utils import get_partition

    topic = response._get_param("TopicArn") or response._get_param("TargetArn")
    if isinstance(topic, str) and topic:
        return topic
    subscription = response._get_param("SubscriptionArn")
    if isinstance(subscription, str) and subscription.count(":") >= 6:
        # arn:aws:sns:REGION:ACCOUNT:TOPIC:SUBSCRIPTION-ID
        return subscription.rsplit(":", 1)[0]
    name = response._get_param("Name")
    if response._get_action() == "CreateTopic" and isinstance(name, str) and name:
        region = response.region
        return f"arn:{get_partition(region)}:sns:{region}:{response.current_account}:{name}"
    return "*"


def _describe_refusal(response: Any, refusal: Exception) -> Refusal:
    # "AWS4-HMAC-SHA256 Credential=AKIA.../20261123/us-east-1/sqs/aws4_request, ..."
    authorization: str = response.headers.get("Authorization") or ""
    scope = authorization.partition("Credential=")[2].partition(",")[0].split("/")
    return Refusal(
        t=time.time(),
        service=scope[3] if len(scope) > 3 else "",
        action=str(response._get_action()),
        access_key_id=scope[0],
        code=str(getattr(refusal, "error_type", type(refusal).__name__)),
        message=str(getattr(refusal, "message", refusal)),
    )
