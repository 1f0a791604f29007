"""A SendMessage's large body: put in S3 before the call, deleted if SQS does not take it.

kombu sends each message with the queue's client's ``send_message`` (outside a
batch-publishing scope), so the work is done by botocore hooks on that client, each
told of the one call by botocore's context of it:

- ``provide-client-params``: the body goes to S3
  (:meth:`~celery_sqs_heartbeat.payloads.store.PayloadStore.offload`), and the context
  notes the object put;
- ``response-received``, after each try, botocore's retries included: a try that got
  no answer (:func:`~celery_sqs_heartbeat.aws.sqs_send.may_have_arrived`) may have put
  the message in SQS, whatever the later tries got;
- ``after-call`` (an answer, an error's too) and ``after-call-error`` (no answer at the
  end): if the call failed and SQS surely does not hold the message, its object is
  deleted (:func:`~celery_sqs_heartbeat.payloads.orphans.discard`), before botocore
  raises the error to kombu and the producer.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from botocore.awsrequest import AWSResponse
from botocore.client import BaseClient

from ..aws.sqs_send import may_have_arrived
from ..process import this_process
from .orphans import discard
from .store import PayloadStore

__all__ = ["offload_on_send"]

#: Where botocore's context of one call keeps what the hooks learnt of it.
_PUT = "celery_sqs_heartbeat.put_object"
_MAYBE_SENT = "celery_sqs_heartbeat.maybe_sent"

_EVENT = "{}.sqs.SendMessage"
_HOOK_ID = "celery_sqs_heartbeat.large_payloads"


def offload_on_send(client: BaseClient, store: PayloadStore) -> None:
    """Make ``client``'s SendMessage send a large body through S3, and clean up after it.

    Registered once per client (botocore drops a second registration of an id).
    """
    events = client.meta.events
    events.register(
        _EVENT.format("provide-client-params"),
        partial(_offload, store, client),
        unique_id=_HOOK_ID,
    )
    events.register(_EVENT.format("response-received"), _note_try, unique_id=f"{_HOOK_ID}.tries")
    events.register(
        _EVENT.format("after-call"), partial(_answered, client), unique_id=f"{_HOOK_ID}.answer"
    )
    events.register(
        _EVENT.format("after-call-error"),
        partial(_discard_unsent, client),
        unique_id=f"{_HOOK_ID}.error",
    )


def _offload(
    store: PayloadStore,
    client: BaseClient,
    params: dict[str, Any],
    context: dict[str, Any],
    **_: Any,
) -> None:
    """Returns None: botocore takes a value returned here for the call's parameters."""
    put = store.offload(client, params)
    if put is not None:
        context[_PUT] = put


def _note_try(context: dict[str, Any], exception: BaseException | None = None, **_: Any) -> None:
    if exception is not None and may_have_arrived(exception):
        context[_MAYBE_SENT] = True


def _answered(
    client: BaseClient, http_response: AWSResponse, context: dict[str, Any], **_: Any
) -> None:
    if http_response.status_code >= 300:
        _discard_unsent(client, context)


def _discard_unsent(client: BaseClient, context: dict[str, Any], **_: Any) -> None:
    """The call failed: its object goes, unless some try may have sent the message."""
    put = context.get(_PUT)
    if put is not None and not context.get(_MAYBE_SENT):
        discard(partial(this_process().clients.s3, client), [put])
