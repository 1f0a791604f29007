"""The order in which the transport's Channel does the work of each kombu hook it overrides.

Pinned before the channel's mixins become one class (issue 31): today the order of each
hook's steps is decided by the base-class list, and these tests say what it is, from the
outside. Each test makes a channel as a worker or a producer does (a kombu ``Connection``
on ``celery_sqs_heartbeat:Transport``) and records, on one timeline, what it asks of
SQS and SNS (every botocore client made during the test answers from :class:`FakeAWS`,
after the client's own hooks have run), what it asks of the lease manager, what it
leaves for the exit clean-up and what it asks of the event loop. No assertion names a
mixin or an attribute of this package's channel.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.awsrequest import AWSResponse
from botocore.client import BaseClient
from kombu import Connection, Exchange, Queue
from kombu.transport import SQS

from celery_sqs_heartbeat import transport
from celery_sqs_heartbeat.aws.sqs_queue import SQSQueue
from celery_sqs_heartbeat.compat import KOMBU_BROADCASTS_THROUGH_SNS
from celery_sqs_heartbeat.leasing.leases import EntryResult
from celery_sqs_heartbeat.leasing.manager import VisibilityExtensionManager
from celery_sqs_heartbeat.monitoring import prometheus
from celery_sqs_heartbeat.process import ProcessState
from celery_sqs_heartbeat.publishing.scope import publishing_in_batches
from celery_sqs_heartbeat.startup.checks import NoCredentialsFound, QueueNotFound
from celery_sqs_heartbeat.transport import Channel
from tests.unit.conftest import Consumer, Settle

BASE = "http://127.0.0.1:9/123456789012"
MISSING = "AWS.SimpleQueueService.NonExistentQueue"
#: A remote-control client's reply queue, as kombu's Mailbox names it (kombu's name).
REPLY_QUEUE = "7f1c0d6e-5bd4-3c0e-9a34-2c9e2f1c1a11.reply.celery.pidbox"
REPLY_SQS_NAME = REPLY_QUEUE.replace(".", "-")
#: An event monitor's queue, named by Celery's receiver with a fresh UUID.
EVENT_QUEUE = "celeryev.0b0f7a58-5a2e-4d73-8d1a-7b5f0c2d9e11"
EVENT_SQS_NAME = EVENT_QUEUE.replace(".", "-")


class FakeAWS:
    """SQS and SNS for every botocore client made meanwhile: each call logged, then answered.

    A client's own hooks (the lease asked for on ReceiveMessage, bodies through S3) run
    before the call is logged, so the log shows the parameters SQS would see. A queue
    exists once created, or listed in ``queues`` by the test; ``refuse`` scripts errors.
    """

    def __init__(self, timeline: list[str]) -> None:
        self.timeline = timeline
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.queues: dict[str, str] = {}
        #: Error codes to answer, by operation, first first.
        self.refusals: dict[str, list[str]] = {}
        #: Run as a DeleteQueue arrives, before it is logged: what the channel is doing then.
        self.on_delete_queue: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def refuse(self, operation: str, *codes: str) -> None:
        self.refusals.setdefault(operation, []).extend(codes)

    def params(self, operation: str) -> list[dict[str, Any]]:
        return [params for name, params in self.calls if name == operation]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = botocore.session.Session.create_client
        fake = self

        def create_client(session: Any, *args: Any, **kwargs: Any) -> BaseClient:
            client: BaseClient = original(session, *args, **kwargs)
            client.meta.events.register("before-parameter-build", fake._note_params)
            client.meta.events.register("before-call", fake._answer)
            return client

        monkeypatch.setattr(botocore.session.Session, "create_client", create_client)

    @staticmethod
    def _note_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["fake_aws_params"] = dict(params)

    def _answer(self, model: Any, context: dict[str, Any], **_: Any) -> Any:
        operation, params = model.name, context.get("fake_aws_params", {})
        with self._lock:
            if operation == "DeleteQueue" and self.on_delete_queue is not None:
                self.on_delete_queue()
            self.calls.append((operation, params))
            self.timeline.append(f"{operation} {_subject(params)}".rstrip())
            refusals = self.refusals.get(operation)
            code = refusals.pop(0) if refusals else self._refusal(operation, params)
            if code is not None:
                error = {"Error": {"Code": code, "Message": f"{code} (fake)"}}
                return AWSResponse("", 400, {}, None), {
                    **error,
                    "ResponseMetadata": {"HTTPStatusCode": 400},
                }
            answer = self._result(operation, params)
        return AWSResponse("", 200, {}, None), {
            **answer,
            "ResponseMetadata": {"HTTPStatusCode": 200},
        }

    def _refusal(self, operation: str, params: dict[str, Any]) -> str | None:
        url = params.get("QueueUrl")
        if operation == "GetQueueUrl" and params["QueueName"] not in self.queues:
            return MISSING
        if url is not None and url not in self.queues.values():
            return MISSING
        return None

    def _result(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        if operation == "ListQueues":
            prefix = params.get("QueueNamePrefix", "")
            return {"QueueUrls": [u for n, u in self.queues.items() if n.startswith(prefix)]}
        if operation == "GetQueueUrl":
            return {"QueueUrl": self.queues[params["QueueName"]]}
        if operation == "CreateQueue":
            url = self.queues[params["QueueName"]] = f"{BASE}/{params['QueueName']}"
            return {"QueueUrl": url}
        if operation == "DeleteQueue":
            self.queues = {n: u for n, u in self.queues.items() if u != params["QueueUrl"]}
            return {}
        if operation == "GetQueueAttributes":
            name = params["QueueUrl"].rsplit("/", 1)[-1]
            return {
                "Attributes": {
                    "ApproximateNumberOfMessages": "0",
                    "QueueArn": f"arn:aws:sqs:us-east-1:123456789012:{name}",
                    "MaximumMessageSize": "262144",
                }
            }
        if operation == "SendMessage":
            return {"MessageId": "m-1", "MD5OfMessageBody": _md5(params["MessageBody"])}
        if operation == "SendMessageBatch":
            return {
                "Successful": [
                    {
                        "Id": e["Id"],
                        "MessageId": f"m-{e['Id']}",
                        "MD5OfMessageBody": _md5(e["MessageBody"]),
                    }
                    for e in params["Entries"]
                ],
                "Failed": [],
            }
        if operation == "CreateTopic":
            return {"TopicArn": f"arn:aws:sns:us-east-1:123456789012:{params['Name']}"}
        if operation == "Subscribe":
            return {"SubscriptionArn": f"{params['TopicArn']}:subscription-1"}
        if operation == "ReceiveMessage":
            return {"Messages": []}
        return {}


def _subject(params: dict[str, Any]) -> str:
    """What a call is about, for the timeline: its queue's name, or its topic's."""
    for key in ("QueueName", "QueueNamePrefix"):
        if key in params:
            return str(params[key])
    if "QueueUrl" in params:
        return str(params["QueueUrl"]).rsplit("/", 1)[-1]
    for key in ("Name", "TopicArn", "SubscriptionArn"):
        if key in params:
            return str(params[key]).rsplit(":", 1)[-1]
    return ""


def _md5(body: str) -> str:
    return hashlib.md5(body.encode()).hexdigest()


class FakeHub:
    """An event loop that only notes what it is asked to run, by the queue it is for."""

    def __init__(self, timeline: list[str]) -> None:
        self.timeline = timeline

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.timeline.append(f"hub.call_soon {args[0] if args else ''}".rstrip())

    def call_later(self, delay: float, callback: Any, *args: Any) -> None:
        self.timeline.append(f"hub.call_later {args[0] if args else ''}".rstrip())

    def call_repeatedly(self, *args: Any) -> None:
        return None


@pytest.fixture
def timeline() -> list[str]:
    return []


@pytest.fixture
def aws(timeline: list[str], monkeypatch: pytest.MonkeyPatch) -> FakeAWS:
    fake = FakeAWS(timeline)
    fake.install(monkeypatch)
    return fake


@pytest.fixture
def noted_manager(
    manager: VisibilityExtensionManager, timeline: list[str], monkeypatch: pytest.MonkeyPatch
) -> VisibilityExtensionManager:
    """The conftest manager (no thread), its deletes, releases, ends and flushes noted.

    A flush is one synchronous check; what it sends to SQS (through the leases' queue,
    which answers OK) is noted as ``sent ...``.
    """
    release, delete, end = manager.release, manager.delete, manager.end

    def noted_release(leases: Any, reason: str, wait: float = 0) -> None:
        leases = list(leases)
        timeline.append(f"manager.release {reason} {_handles(lease for lease, _ in leases)}")
        release(leases, reason, wait)

    def noted_delete(lease: Any, wait: float) -> None:
        timeline.append(f"manager.delete {lease.receipt_handle}")
        delete(lease, wait)

    def noted_end(lease: Any) -> None:
        timeline.append(f"manager.end {lease.receipt_handle}")
        end(lease)

    def noted_flush(timeout: float) -> int:
        timeline.append("manager.flush")
        manager.check()
        return 0

    def change_visibility(_: SQSQueue, entries: Any) -> Any:
        timeline.append(f"sent visibility {_handles(lease for lease, _ in entries)}")
        return {lease: (EntryResult.OK, "") for lease, _ in entries}

    def delete_messages(_: SQSQueue, leases: Any) -> Any:
        timeline.append(f"sent delete {_handles(leases)}")
        return {lease: (EntryResult.OK, "") for lease in leases}

    monkeypatch.setattr(manager, "release", noted_release)
    monkeypatch.setattr(manager, "delete", noted_delete)
    monkeypatch.setattr(manager, "end", noted_end)
    monkeypatch.setattr(manager, "flush", noted_flush)
    monkeypatch.setattr(SQSQueue, "change_visibility", change_visibility)
    monkeypatch.setattr(SQSQueue, "delete", delete_messages)
    return manager


def _handles(leases: Iterable[Any]) -> str:
    return ",".join(sorted(lease.receipt_handle for lease in leases))


@pytest.fixture
def noted_leftovers(
    process_state: ProcessState, timeline: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a declare leaves for the process's exit, noted instead of kept."""
    leftovers = process_state.leftovers

    def add_channel(channel: Any, pid: int) -> None:
        timeline.append("leftovers.add_channel")

    def used(url: str, delete: Any, pid: int, now: float) -> None:
        timeline.append(f"leftovers.reply_queue_used {url.rsplit('/', 1)[-1]}")

    monkeypatch.setattr(leftovers, "add_channel", add_channel)
    monkeypatch.setattr(leftovers.reply_queues, "used", used)


OpenChannel = Callable[..., Channel]


@pytest.fixture
def open_channel(
    aws: FakeAWS,
    noted_manager: VisibilityExtensionManager,
    noted_leftovers: None,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[OpenChannel]:
    """A new connection's channel, its event loop none unless ``hub`` is given.

    kombu 5.5 and 5.6 keep the queue URL cache and the predefined queues' clients on the
    class: each test starts with them empty, so no client made before ``aws`` answers
    (or another test's URL) is reused.
    """
    for cache in ("_queue_cache", "_predefined_queue_clients"):
        if cache in vars(SQS.Channel):
            monkeypatch.setattr(SQS.Channel, cache, {})
    opened: list[Channel] = []

    def open_one(hub: Any = None, **options: Any) -> Channel:
        connection = Connection(
            "sqs://key:secret@127.0.0.1:9/",
            transport="celery_sqs_heartbeat:Transport",
            transport_options={"region": "us-east-1", **options},
        )
        connection.transport.manager = noted_manager
        channel = connection.channel()
        channel.hub = hub
        opened.append(channel)
        return channel

    yield open_one
    for channel in opened:
        if not channel.closed:
            channel.close()


def task_message(
    channel: Channel,
    handle: str,
    queue: str = "jobs",
    exchange: str = "jobs",
    routing_key: str = "jobs",
) -> dict[str, Any]:
    """A task message as SQS answers a receive, ``handle`` its receipt handle."""
    headers = {"id": f"task-{handle}", "task": "proj.tasks.report", "eta": None, "expires": None}
    properties = {"delivery_info": {"exchange": exchange, "routing_key": routing_key}}
    body = channel.prepare_message(
        json.dumps([[], {}, {}]), 0, "application/json", "utf-8", headers, properties
    )
    return {
        "MessageId": f"message-{handle}",
        "ReceiptHandle": handle,
        "Body": json.dumps(body),
        "Attributes": {"ApproximateReceiveCount": "1"},
    }


def receive(channel: Channel, queue: str, *messages: dict[str, Any]) -> None:
    """An answer to the event loop's long poll on ``queue``, as kombu hands it over."""
    url = channel._new_queue(queue)
    channel._on_messages_ready(url, queue, {"Messages": list(messages)})


def reply_queue(channel: Channel) -> Queue:
    """A remote-control client's reply queue, declared as kombu's Mailbox declares it."""
    exchange = Exchange("reply.celery.pidbox", "direct", durable=False, auto_delete=True)
    return Queue(
        REPLY_QUEUE, exchange, routing_key="oid", durable=False, auto_delete=True, message_ttl=300
    )(channel)


def event_queue(channel: Channel, routing_key: str = "worker.#") -> Queue:
    """An event monitor's queue, declared as Celery's EventReceiver declares it."""
    exchange = Exchange("celeryev", "topic", durable=True)
    return Queue(
        EVENT_QUEUE,
        exchange,
        routing_key=routing_key,
        durable=False,
        auto_delete=True,
        message_ttl=5.0,
    )(channel)


# --- __init__ -----------------------------------------------------------------------------


def test_init_warns_of_the_options_then_checks_credentials_before_any_call_to_sqs(
    aws: FakeAWS, nowhere: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Order of ``__init__``: the options' warnings, then the credentials, then kombu's
    own start (its first call to SQS, ListQueues).

    The warnings come first because a worker's logging is set up only by the time it
    connects, and a worker without credentials stops right there: warned after the
    check, a misspelt option would never be named. The credentials come before kombu's
    start because botocore's NoCredentialsError raised from ListQueues is one of kombu's
    connection errors, which Celery retries a hundred times instead of stopping.
    """
    connection = Connection(
        "sqs://",
        transport="celery_sqs_heartbeat:Transport",
        transport_options={"region": "us-east-1", "release_on_shutdwn": False},
    )

    with caplog.at_level(logging.WARNING), pytest.raises(NoCredentialsFound):
        connection.channel()

    assert "'release_on_shutdwn', did you mean 'release_on_shutdown'" in caplog.text
    assert aws.calls == []


def test_init_makes_kombus_queue_listing_its_only_call(
    open_channel: OpenChannel, aws: FakeAWS, timeline: list[str]
) -> None:
    """Order of ``__init__``, with credentials: kombu's start (ListQueues, filling its
    URL cache) is the one call a new channel makes, and the channel is whole after it.

    A call of this package's own at start-up (a check, a subscription) would run on
    every connection a worker or a producer opens, reconnects included.
    """
    aws.queues["jobs"] = f"{BASE}/jobs"

    channel = open_channel()

    assert timeline == ["ListQueues"]
    assert channel._new_queue("jobs") == f"{BASE}/jobs"  # from kombu's cache: no call
    assert timeline == ["ListQueues"]


# --- queue_declare ------------------------------------------------------------------------


def test_declaring_a_reply_queue_creates_it_with_its_retention_then_keeps_it_by_its_url(
    open_channel: OpenChannel, aws: FakeAWS, timeline: list[str]
) -> None:
    """Order of ``queue_declare`` (an auto-delete reply queue with a TTL): the TTL is
    noted before kombu creates the queue, so CreateQueue carries its retention; kombu's
    size check follows; only then, with the URL SQS gave, the queue is noted as a kept
    reply queue and the channel as one with auto-delete queues to remove at exit.

    Noted after the TTL's turn, the queue would keep messages four days; noted before
    the creation answered, the reply-queue book would hold no URL (or a stale one), and
    the exit would leave the queue behind. Which of the two exit notes comes first does
    not matter: both are read only at exit.
    """
    channel = open_channel()
    timeline.clear()

    reply_queue(channel).declare()

    assert timeline[:3] == [
        "ListQueues " + REPLY_SQS_NAME,
        "CreateQueue " + REPLY_SQS_NAME,
        "GetQueueAttributes " + REPLY_SQS_NAME,
    ]
    assert sorted(timeline[3:]) == [
        "leftovers.add_channel",
        "leftovers.reply_queue_used " + REPLY_SQS_NAME,
    ]
    assert aws.params("CreateQueue")[0]["Attributes"]["MessageRetentionPeriod"] == "300"


def test_redeclaring_a_queue_deleted_elsewhere_recreates_it_before_any_bookkeeping(
    open_channel: OpenChannel, aws: FakeAWS, timeline: list[str]
) -> None:
    """Order of ``queue_declare`` when the cached URL is of a deleted queue: kombu's
    declare fails on it (NonExistentQueue), the URL is forgotten, kombu's declare runs
    once more and creates the queue, with the TTL's retention noted before the first
    try; the bookkeeping follows, once, with the new URL; no error reaches the caller.

    Remote control's reply queues are deleted by whichever process is done with them:
    an ``inspect`` that failed here was a second ``inspect`` failing. Bookkeeping before
    the retry would keep the old URL.
    """
    channel = open_channel()
    reply_queue(channel).declare()
    aws.queues.clear()  # deleted by another process; this channel's cache still has it
    timeline.clear()

    reply_queue(channel).declare()

    assert timeline[:4] == [
        "GetQueueAttributes " + REPLY_SQS_NAME,  # the stale URL: refused
        "ListQueues " + REPLY_SQS_NAME,
        "CreateQueue " + REPLY_SQS_NAME,
        "GetQueueAttributes " + REPLY_SQS_NAME,
    ]
    assert sorted(timeline[4:]) == [
        "leftovers.add_channel",
        "leftovers.reply_queue_used " + REPLY_SQS_NAME,
    ]
    assert [p["Attributes"]["MessageRetentionPeriod"] for p in aws.params("CreateQueue")] == [
        "300",
        "300",
    ]


def test_declaring_a_missing_predefined_queue_names_it_before_anything_is_noted(
    open_channel: OpenChannel, aws: FakeAWS, timeline: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Order of ``queue_declare`` on a predefined queue that does not exist: the retry
    with a forgotten URL comes first (kombu's cache gives the same predefined URL, and
    SQS refuses it again), then the start-up check turns SQS's NonExistentQueue into one
    error naming the queue and its URL, which Celery's worker logs as one CRITICAL line;
    nothing is left for the exit.

    The check must see the error last, after the retry, or a queue merely deleted
    and re-creatable would stop the worker; and the bookkeeping must come after a
    declare that succeeded, or the exit would try to remove a queue never declared.
    """
    from celery.utils.log import worker_logger

    url = f"{BASE}/jobs"
    channel = open_channel(predefined_queues={"jobs": {"url": url}})
    timeline.clear()

    with pytest.raises(QueueNotFound) as raised:
        channel.queue_declare("jobs", auto_delete=True)

    assert timeline == ["GetQueueAttributes jobs", "GetQueueAttributes jobs"]
    assert str(raised.value).startswith(
        f"SQS queue jobs does not exist at {url} (its URL in predefined_queues): "
        "GetQueueAttributes answered NonExistentQueue"
    )
    with caplog.at_level(logging.CRITICAL):
        worker_logger.critical("Unrecoverable error: %r", raised.value, exc_info=raised.value)
    [line] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert line.getMessage() == str(raised.value) and line.exc_info is None


# --- basic_consume ------------------------------------------------------------------------


@pytest.fixture
def exporter(timeline: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The metrics exporter not yet started in this process; its start noted, no port opened.

    The OpenTelemetry instruments' registration is noted too, never made.
    """
    import prometheus_client

    def start_http_server(port: int, addr: str = "", **_: Any) -> None:
        timeline.append(f"exporter started {port}")

    monkeypatch.setattr(prometheus, "_exporter_started", False)
    monkeypatch.setattr(prometheus_client, "start_http_server", start_http_server)
    monkeypatch.setattr(
        transport, "register_instruments", lambda: timeline.append("instruments registered")
    )


def events_channel(open_channel: OpenChannel, hub: Any = None, **options: Any) -> Channel:
    """A monitor's channel: events through SNS, its event queue declared and bound."""
    channel = open_channel(hub=hub, supports_fanout=True, events_through_sns=True, **options)
    event_queue(channel).declare()
    return channel


@pytest.mark.skipif(
    not KOMBU_BROADCASTS_THROUGH_SNS,
    reason="SNS fanout (subscriptions, event topics) is kombu 5.7's",
)
def test_consuming_starts_the_exporter_then_subscribes_then_polls(
    open_channel: OpenChannel, exporter: None, timeline: list[str]
) -> None:
    """Order of ``basic_consume``: the metrics exporter starts first, the OpenTelemetry
    instruments are registered, then kombu subscribes the queue to its SNS topic, then
    kombu's first poll is scheduled.

    The exporter is started, and the instruments registered, by consumers only (a
    producer never opens a port, nor holds a lease), and before
    kombu's part: an exporter that cannot start without prometheus-client stops the
    worker at start-up, before it subscribed anything or took a message. The subscription
    precedes the first poll so that no event published meanwhile is missed for good.
    """
    hub = FakeHub(timeline)
    channel = events_channel(open_channel, hub=hub, metrics_port=9808)
    timeline.clear()

    channel.basic_consume(EVENT_QUEUE, False, lambda message: None, "monitor")

    assert timeline[:2] == ["exporter started 9808", "instruments registered"]
    assert timeline.index("Subscribe celeryev") < timeline.index("hub.call_soon " + EVENT_QUEUE)
    assert timeline[-1] == "hub.call_soon " + EVENT_QUEUE


@pytest.mark.skipif(
    not KOMBU_BROADCASTS_THROUGH_SNS,
    reason="SNS fanout (subscriptions, event topics) is kombu 5.7's",
)
def test_an_event_the_binding_does_not_match_is_claimed_then_acked_never_delivered(
    open_channel: OpenChannel, timeline: list[str]
) -> None:
    """Order of ``basic_consume``'s callback (events through SNS): kombu's wrapper takes
    the message into the QoS first (its lease is claimed), then the binding's pattern
    decides, and an event the queue did not ask for is acked (its delete left to the
    manager) without reaching the consumer.

    SNS hands every event on the topic to every monitor's queue. Filtered before the
    claim, an unwanted event would hold a lease nobody acks, renewed for 12 hours;
    filtered after the consumer's callback, the monitor would see it.
    """
    channel = events_channel(open_channel)
    delivered: list[Any] = []
    channel.basic_consume(EVENT_QUEUE, False, delivered.append, "monitor")
    timeline.clear()

    receive(
        channel,
        EVENT_QUEUE,
        task_message(channel, "unwanted", EVENT_QUEUE, "celeryev", "task.succeeded"),
        task_message(channel, "wanted", EVENT_QUEUE, "celeryev", "worker.heartbeat"),
    )

    assert [m.delivery_tag for m in delivered] == ["wanted"]
    assert timeline == ["manager.delete unwanted"]


# --- basic_cancel -------------------------------------------------------------------------


@pytest.mark.skipif(
    not KOMBU_BROADCASTS_THROUGH_SNS,
    reason="SNS fanout (subscriptions, event topics) is kombu 5.7's",
)
def test_cancelling_the_last_consumer_of_a_monitors_queue_stops_polling_then_deletes_it(
    open_channel: OpenChannel, aws: FakeAWS, timeline: list[str]
) -> None:
    """Order of ``basic_cancel`` on a single-use auto-delete queue (a monitor's): kombu
    cancels the consumer first; only when no consumer of the channel is left on the
    queue is it deleted (kombu's DeleteQueue, then its SNS Unsubscribe), and its URL
    forgotten, so a later declare of the name creates it again.

    Deleted while still polled, the queue's next receive would find it gone and take
    its absence for a misconfiguration; deleted with a second consumer left, that
    consumer would lose its queue.
    """
    channel = events_channel(open_channel)
    channel.basic_consume(EVENT_QUEUE, False, lambda message: None, "first")
    channel.basic_consume(EVENT_QUEUE, False, lambda message: None, "second")
    aws.on_delete_queue = lambda: timeline.append(
        f"still polled: {EVENT_QUEUE in channel._active_queues}"
    )
    timeline.clear()

    channel.basic_cancel("first")
    assert timeline == []

    channel.basic_cancel("second")
    assert timeline == [
        "still polled: False",
        "DeleteQueue " + EVENT_SQS_NAME,
        "Unsubscribe subscription-1",
    ]
    timeline.clear()
    event_queue(channel).declare()
    assert timeline[:2] == ["ListQueues " + EVENT_SQS_NAME, "CreateQueue " + EVENT_SQS_NAME]


def test_a_delete_that_fails_at_the_cancel_is_logged_after_the_consumer_is_gone(
    open_channel: OpenChannel, aws: FakeAWS, caplog: pytest.LogCaptureFixture
) -> None:
    """Order of ``basic_cancel`` when SQS refuses the delete: the consumer is cancelled
    (kombu's part ran first), and the refusal is a WARNING, never raised.

    The consumer is leaving anyway, often at exit: an error here would stop ``celery
    events`` with a traceback and leave the rest of its clean-up undone.
    """
    channel = events_channel(open_channel)
    channel.basic_consume(EVENT_QUEUE, False, lambda message: None, "monitor")
    aws.refuse("DeleteQueue", "AccessDenied")

    with caplog.at_level(logging.WARNING):
        channel.basic_cancel("monitor")

    assert EVENT_QUEUE not in channel._active_queues
    assert f"Could not remove the auto-delete queue {EVENT_QUEUE!r}" in caplog.text


# --- _put ---------------------------------------------------------------------------------


@pytest.fixture
def noted_log(timeline: list[str]) -> Iterator[None]:
    """This package's log lines on the timeline, by level and first words."""

    class Noting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            timeline.append(f"log {record.levelname} {record.getMessage()[:30]}")

    handler = Noting(logging.INFO)
    package = logging.getLogger("celery_sqs_heartbeat")
    level = package.level
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    yield
    package.removeHandler(handler)
    package.setLevel(level)


def message(channel: Channel, **extra: Any) -> dict[str, Any]:
    body = channel.prepare_message("{}", 0, "application/json", "utf-8", {"id": "task-p"}, {})
    return {**body, **extra}


def test_a_reply_to_a_reply_queue_gone_is_dropped_after_kombus_send_and_its_url_forgotten(
    open_channel: OpenChannel, aws: FakeAWS, timeline: list[str], noted_log: None
) -> None:
    """Order of ``_put`` to a reply queue that is gone: kombu's SendMessage to the cached
    URL is refused, then the reply is dropped with one INFO line and the URL forgotten;
    the next reply asks SQS for the queue again, and SQS refusing to re-create it
    (QueueDeletedRecently) is dropped the same way.

    A broker drops a message routed to no queue. Raised instead, the error reached the
    worker's remote control, which restarted its consumer and lost the commands sent
    meanwhile; with the URL kept, every later reply would go to the dead URL.
    """
    channel = open_channel()
    reply_queue(channel).declare()
    aws.queues.clear()
    aws.refuse("CreateQueue", "QueueDeletedRecently")
    timeline.clear()

    channel._put(REPLY_QUEUE, message(channel))
    channel._put(REPLY_QUEUE, message(channel))

    assert timeline == [
        "SendMessage " + REPLY_SQS_NAME,
        f"log INFO A reply to {REPLY_QUEUE}"[:39],
        "ListQueues " + REPLY_SQS_NAME,
        "CreateQueue " + REPLY_SQS_NAME,
        f"log INFO A reply to {REPLY_QUEUE}"[:39],
    ]


def test_a_put_in_a_batch_scope_resolves_its_queue_at_once_and_sends_in_a_batch(
    open_channel: OpenChannel, aws: FakeAWS, timeline: list[str], noted_log: None
) -> None:
    """Order of ``_put`` inside ``publishing_in_batches``: kombu's part runs in the
    caller (the queue's URL resolved, created if need be), its SendMessage is caught
    and goes out in a SendMessageBatch; a redelivery (kombu's restore) is kombu's own
    ChangeMessageVisibility, made at once; a reply whose queue SQS will not re-create
    is dropped inside kombu's part, so the scope has nothing of it to send or fail.

    The catching must wrap the reply-queue drop, not the other way round, or that
    dropped reply would end the scope with PublishingFailed.
    """
    channel = open_channel()
    aws.refuse("CreateQueue", "QueueDeletedRecently")  # the reply queue's
    timeline.clear()

    with publishing_in_batches():
        channel._put(REPLY_QUEUE, message(channel))
        channel._put("hook.order.jobs", message(channel))
        channel._put(
            "hook.order.jobs",
            message(channel, redelivered=True, properties={"delivery_tag": "rh-back"}),
        )
        timeline.append("scope-ended")

    sent = [t.split()[0] for t in timeline if not t.startswith(("log", "GetQueueAttributes"))]
    assert sent == [
        "ListQueues",
        "CreateQueue",  # the reply queue's: refused, the reply dropped
        "ListQueues",
        "CreateQueue",  # hook-order-jobs
        "ChangeMessageVisibility",
        "scope-ended",
        "SendMessageBatch",
    ]
    assert "SendMessage" not in [name for name, _ in aws.calls]


def countdown_message(channel: Channel, task_id: str, countdown: float) -> dict[str, Any]:
    """A task published with a countdown, as Celery's producer hands it to ``_put``."""
    eta = datetime.now(timezone.utc) + timedelta(seconds=countdown)
    headers = {"id": task_id, "task": "proj.tasks.report", "eta": eta.isoformat()}
    return channel.prepare_message("{}", 0, "application/json", "utf-8", headers, {})


def test_a_countdowns_delay_is_set_before_kombus_send_in_and_out_of_a_batch_scope(
    open_channel: OpenChannel, aws: FakeAWS
) -> None:
    """Order of ``_put`` for a task with an ETA: its delay is set in the message first,
    so kombu's SendMessage carries it, and so does the SendMessageBatch entry made of
    the SendMessage a scope caught; a FIFO queue's message goes without one.

    Set after kombu's part, the delay would reach SQS in neither call, and the worker
    would receive the task at once and hold it until due.
    """
    channel = open_channel()
    fifo = Queue("hook.order.jobs.fifo", Exchange("hook.order.fifo", "direct"), routing_key="f")
    fifo(channel).declare()

    channel._put("hook.order.jobs", countdown_message(channel, "alone", 120.9))
    channel._put("hook.order.jobs.fifo", countdown_message(channel, "in-fifo", 120.9))
    with publishing_in_batches():
        channel._put("hook.order.jobs", countdown_message(channel, "in-scope", 300.9))

    alone, in_fifo = aws.params("SendMessage")
    (batch,) = aws.params("SendMessageBatch")
    (entry,) = batch["Entries"]
    # Whole seconds to the ETA, read when each _put ran (a generous guard for a slow run).
    assert 110 <= alone["DelaySeconds"] <= 120
    assert "DelaySeconds" not in in_fifo
    assert 290 <= entry["DelaySeconds"] <= 300


# --- _delete ------------------------------------------------------------------------------


def test_deleting_a_dotted_queue_forgets_its_url_after_sqs_deleted_it(
    open_channel: OpenChannel, aws: FakeAWS, timeline: list[str]
) -> None:
    """Order of ``_delete`` (kombu's ``queue_delete``, once per binding): kombu's
    DeleteQueue, then the URL forgotten under the queue's SQS name (kombu forgets it
    under the name as given, which for a dotted name is not the key it cached).

    With the URL kept, the next declare of the name asked SQS about the deleted URL and
    failed instead of creating the queue: an application's second ``inspect``.
    """
    channel = open_channel()
    queue = Queue("hook.order.dotted", Exchange("hook.order", "direct"), routing_key="k")(channel)
    queue.declare()
    timeline.clear()

    channel.queue_delete("hook.order.dotted")
    queue.declare()

    assert timeline == [
        "DeleteQueue hook-order-dotted",
        "ListQueues hook-order-dotted",
        "CreateQueue hook-order-dotted",
        "GetQueueAttributes hook-order-dotted",
    ]


# --- sqs ----------------------------------------------------------------------------------


def test_every_client_the_channel_hands_out_asks_for_the_channels_lease(
    open_channel: OpenChannel, aws: FakeAWS
) -> None:
    """Composition of ``sqs``: kombu's client (a predefined queue's own, or the
    channel's), with the lease asked for on every ReceiveMessage unless the caller set
    one, also when the client is first made inside a batch scope's ``_put``.

    Without it SQS applies the queue's attribute, which may be hours: the lease must be
    the one the manager renews. The catching of SendMessage wraps the client last, for
    the calling thread only, so other calls made through it go out as ever.
    """
    channel = open_channel(
        visibility_timeout=45, predefined_queues={"jobs": {"url": f"{BASE}/jobs"}}
    )
    aws.queues["jobs"] = f"{BASE}/jobs"
    with publishing_in_batches():
        channel._put("jobs", message(channel))
        channel.sqs(queue="jobs").receive_message(QueueUrl=f"{BASE}/jobs")
    channel.sqs().receive_message(QueueUrl=f"{BASE}/jobs", VisibilityTimeout=5)

    assert [p.get("VisibilityTimeout") for p in aws.params("ReceiveMessage")] == [45, 5]
    assert [name for name, _ in aws.calls if name.startswith("SendMessage")] == ["SendMessageBatch"]


# --- close --------------------------------------------------------------------------------


class Request:
    """What the transport reads of a Celery request: ``acked`` if Celery asked to ack it."""

    def __init__(self, message: Any, acked: bool) -> None:
        self.id = f"task-{message.delivery_tag}"
        self.message = message
        self.acknowledged = acked
        self.on_ack = Settle(acked)
        self.on_reject = Settle(False)
        self._apply_result = None


@pytest.mark.skipif(
    not KOMBU_BROADCASTS_THROUGH_SNS,
    reason="SNS fanout (subscriptions, event topics) is kombu 5.7's",
)
def test_close_cancels_then_settles_what_it_holds_then_flushes_without_waking_a_receive(
    open_channel: OpenChannel, aws: FakeAWS, timeline: list[str]
) -> None:
    """Order of ``close``: the parked receive loop is forgotten first; then kombu's close
    cancels the consumers (a monitor's queue deleted), acks the message whose ack Celery
    queued and releases the one it will not run; then the manager flushes, sending that
    delete and that release.

    Forgotten after kombu's close, the room the close's own ack frees would schedule a
    receive on a closed channel. The flush comes last so that the delete and the
    release made by the close go out now, not at the next check a process that is
    stopping may never run.
    """
    from celery.signals import task_received

    aws.queues["jobs"] = f"{BASE}/jobs"
    hub = FakeHub(timeline)
    channel = events_channel(open_channel, hub=hub, ack_batch_interval=0)
    channel.basic_qos(prefetch_count=2)
    delivered: list[Any] = []
    channel.basic_consume("jobs", False, delivered.append, "worker")
    channel.basic_consume(EVENT_QUEUE, False, lambda message: None, "monitor")
    receive(channel, "jobs", task_message(channel, "ended"), task_message(channel, "waiting"))
    task_received.send(sender=Consumer(), request=Request(delivered[0], acked=True))
    task_received.send(sender=Consumer(), request=Request(delivered[1], acked=False))
    timeline.clear()
    channel._schedule_queue("jobs")  # the window is full: the queue waits for room
    assert timeline == ["hub.call_later jobs"]
    timeline.clear()

    channel.close()

    assert timeline == [
        "DeleteQueue " + EVENT_SQS_NAME,
        "Unsubscribe subscription-1",
        "manager.delete ended",
        "manager.release shutdown waiting",
        "manager.flush",
        "sent delete ended",
        "sent visibility waiting",
    ]
    assert not channel.celery_requests.will_run("waiting", None)
