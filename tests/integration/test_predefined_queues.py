"""predefined_queues: renewals, deletes, releases and S3 calls go out with each queue's credentials.

Two setups of kombu's ``predefined_queues``, each run by a real worker on a server that
enforces IAM:

- per-queue access keys: two queues, each with its own IAM user, and a broker URL whose
  key has no SQS rights on either queue. A call made with the wrong key is refused.
- ``sts_role_arn``: the worker's base credentials may only assume a role, and only the
  role may use the queue. kombu refreshes the role's credentials while a task runs.

In both, each queue's key (or the role) is also allowed the worker S3 statements of docs/iam.md
on the large-payload bucket, and no other key is: a task whose body went through S3 runs
only if its object is read, and deleted, with the queue's own credentials.

Which key signed each call is read from moto's request recorder (``/moto-api/recorder``,
every request with its headers, refused ones included), started on this module's own
server. moto does not expire assumed-role credentials, so a call signed with credentials
AWS would reject as expired would pass here: the STS test checks from the recording that
no role key was used after kombu itself took it for expired.
"""

from __future__ import annotations

import collections
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from kombu.transport import SQS

from celery_sqs_heartbeat.testing import Event, Refusal, StrictSQSServer
from tests.integration.harness import Bed, broker_url, create_queue, report, settle, worker
from tests.integration.iam import ACCOUNT_ID, Call, Iam, Keys, allow, client, recorded
from tests.integration.sqs_reads import dead_letter_count, releases
from tests.integration.test_iam_large_payloads import BUCKET, LARGE, PREFIX, s3_statements

#: Short, so that tasks outlive several leases, but not so short that a renewal thread
#: starved on two saturated cores lets it run out (3 s did, by a tenth of a second).
LEASE = 5
REGION = StrictSQSServer.REGION
#: The ``enforced`` fixture's server records every request: which key signed each call.
IAM_RECORDING = True
#: How long kombu uses one set of role credentials: AWS's minimum session (botocore
#: refuses a shorter DurationSeconds before sending) less kombu 5.6+'s early-refresh
#: buffer. AWS would accept these options as they are.
STS_TOKEN_TIMEOUT = 900
TOKEN_LIFETIME = 6
#: What a worker needs on a predefined queue, and nothing else.
WORKER_ACTIONS = [
    "sqs:ReceiveMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
]


def queue_arn(name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{name}"


def worker_policy(queue: str) -> dict[str, Any]:
    """A worker's rights on ``queue``, and the worker S3 statements of docs/iam.md."""
    policy = allow(WORKER_ACTIONS, queue_arn(queue))
    return {**policy, "Statement": [*policy["Statement"], *s3_statements("worker")]}


#: Bodies over SQS's limit go to the bucket, for producer and worker alike.
LARGE_PAYLOADS = {"large_payload_bucket": BUCKET, "large_payload_prefix": PREFIX}


@dataclass(frozen=True)
class Setup:
    """A server that enforces IAM and records every request, and what was made on it first."""

    server: StrictSQSServer
    ops: Keys
    """Stands for the infrastructure code: allowed all of SQS."""
    broker: Keys
    """The broker URL's key in the per-queue test: SQS rights, but not on its queues."""
    queue_keys: dict[str, Keys]
    """The two per-key queues, each with the key of the only user allowed on it."""
    sts_base: Keys
    """May assume the role, and nothing else."""
    role_queue: str
    role_arn: str
    urls: dict[str, str]

    def sqs(self, keys: Keys) -> Any:
        return client(self.server, "sqs", keys, retries=False)

    def recorded(self) -> list[Call]:
        return recorded(self.server)

    def bed(self, queue: str, tmp_path: Path) -> Bed:
        return Bed(
            server=self.server, queue=queue, records=tmp_path / "executions.jsonl", logs=tmp_path
        )

    def send(self, bed: Bed, task: str, *args: Any) -> str:
        """Publish as a producer with its own rights does: here, ops."""
        options = {
            "predefined_queues": {bed.queue: {"url": self.urls[bed.queue]}},
            **LARGE_PAYLOADS,
        }
        return bed.send(task, *args, credentials=self.ops, transport_options=options)

    def send_large(self, bed: Bed, label: str) -> tuple[str, str]:
        """A task whose body goes through S3, and its object's key: read from the
        producer's PutObject, since a quick worker may have deleted the object already."""
        recorded_before = len(self.recorded())
        task_id = self.send(bed, "sized", label, "x" * LARGE)
        [key] = [
            call.objects[0]
            for call in self.recorded()[recorded_before:]
            if call.action == "s3:PutObject" and call.access_key_id == self.ops[0]
        ]
        return task_id, key

    def objects(self) -> list[str]:
        s3 = client(self.server, "s3", self.ops)
        listed = s3.list_objects_v2(Bucket=BUCKET).get("Contents") or []
        return [entry["Key"] for entry in listed]


def iam_setup(iam: Iam) -> Setup:
    """The queues, users, role and bucket of this module, made before the ``enforced``
    fixture enforces IAM."""
    suffix = uuid.uuid4().hex[:8]
    first, second, role_queue = (f"pq-{n}-{suffix}" for n in ("first", "second", "role"))
    admin = iam.admin("sqs")
    # Every failed task is released twice, then dead-lettered by the third receive.
    urls = {
        name: create_queue(admin, name, 30, max_receive_count=2)
        for name in (first, second, role_queue)
    }
    role_arn = iam.role(f"celery-worker-{suffix}", "sts-base", worker_policy(role_queue))
    iam.admin("s3").create_bucket(Bucket=BUCKET)
    return Setup(
        server=iam.server,
        ops=iam.user("ops", allow(["sqs:*", "s3:*"], "*")),
        broker=iam.user("broker", allow("sqs:*", queue_arn("elsewhere-*"))),
        queue_keys={
            name: iam.user(f"worker-{name}", worker_policy(name)) for name in (first, second)
        },
        sts_base=iam.user("sts-base", allow("sts:AssumeRole", role_arn)),
        role_queue=role_queue,
        role_arn=role_arn,
        urls=urls,
    )


def refused_since(server: StrictSQSServer, count: int) -> list[Refusal]:
    return server.refused_calls()[count:]


def events_by_message(server: StrictSQSServer, queue: str) -> dict[str, list[Event]]:
    by_message: dict[str, list[Event]] = collections.defaultdict(list)
    for event in server.events():
        if event["queue"] == queue and event["message_id"]:
            by_message[event["message_id"]].append(event)
    return by_message


def renewed_messages(server: StrictSQSServer, queue: str) -> list[list[Event]]:
    """The events of each message of ``queue`` whose lease was renewed."""
    return [
        events
        for events in events_by_message(server, queue).values()
        if any(e["action"] == "change_visibility" and e["visibility"] == LEASE for e in events)
    ]


def renewed_message(server: StrictSQSServer, queue: str) -> list[Event]:
    """The events of the long task's message: renewed most, and never released.

    The failing task's message may be renewed too, when its receive falls just before a
    renewal of the long task's and joins that batch; but it is released after each run.
    A short task's may be renewed once while its delete is on the wire.
    """
    renewed = [
        events
        for events in renewed_messages(server, queue)
        if not any(e["action"] == "change_visibility" and e["visibility"] == 0 for e in events)
    ]
    assert renewed, renewed
    return max(renewed, key=lambda events: [e["action"] for e in events].count("change_visibility"))


def long_task_deleted(server: StrictSQSServer, queue: str) -> bool:
    return any(
        e["action"] == "delete" and e["result"] == "ok"
        for events in renewed_messages(server, queue)
        for e in events
    )


def lapses(events: list[Event]) -> list[Event]:
    """What shows that one message's lease ran out while it was held: none, if it held.

    The strict server refuses a renewal of a lease that expired, and hands the message
    out again: so a lapse is a failed renewal or a second receive, whatever the timing.
    """
    receives = [e for e in events if e["action"] == "receive" and e["result"] == "ok"]
    renewals = [e for e in events if e["action"] == "change_visibility" and e["visibility"]]
    return receives[1:] + [e for e in renewals if e["result"] != "ok"]


def confirmed_releases(server: StrictSQSServer, queue: str) -> list[Event]:
    """The releases of ``queue``'s messages that SQS took."""
    return [e for e in releases(server.events()) if e["queue"] == queue and e["result"] == "ok"]


def assert_no_secret_in(log: str, *keys: Keys) -> None:
    for _, secret in keys:
        assert secret not in log


def test_each_predefined_queue_is_worked_with_its_own_access_key(
    enforced: Setup, tmp_path: Path
) -> None:
    first, second = enforced.queue_keys
    server = enforced.server
    # The premise, checked on the server: the broker URL's key may not touch either
    # queue, and each queue's key only its own.
    for keys, queue in [
        (enforced.broker, first),
        (enforced.broker, second),
        (enforced.queue_keys[first], second),
        (enforced.queue_keys[second], first),
    ]:
        sqs = enforced.sqs(keys)
        renewal = [{"Id": "0", "ReceiptHandle": "never-issued", "VisibilityTimeout": LEASE}]
        for operation, arguments in [
            ("receive_message", {}),
            ("change_message_visibility_batch", {"Entries": renewal}),
        ]:
            with pytest.raises(ClientError) as denied:
                getattr(sqs, operation)(QueueUrl=enforced.urls[queue], **arguments)
            assert denied.value.response["Error"]["Code"] == "AccessDenied"
    broker_s3 = client(server, "s3", enforced.broker)
    with pytest.raises(ClientError, match="AccessDenied"):
        broker_s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}any")
    refused_before = len(server.refused_calls())
    recorded_before = len(enforced.recorded())

    beds = {queue: enforced.bed(queue, tmp_path) for queue in (first, second)}
    large = {queue: enforced.send_large(bed, f"large-{queue}") for queue, bed in beds.items()}
    long_tasks = {
        queue: enforced.send(bed, "busy", f"long-{queue}", 3 * LEASE) for queue, bed in beds.items()
    }
    failing = {
        queue: enforced.send(bed, "fails", f"failed-{queue}", "error")
        for queue, bed in beds.items()
    }
    predefined = {
        queue: {
            "url": enforced.urls[queue],
            "access_key_id": keys[0],
            "secret_access_key": keys[1],
        }
        for queue, keys in enforced.queue_keys.items()
    }
    started = time.monotonic()
    with worker(
        beds[first],
        "threads",
        4,
        "per-queue-keys",
        options={
            "visibility_timeout": LEASE,
            "release_on_failure": True,
            "predefined_queues": predefined,
            **LARGE_PAYLOADS,
        },
        IT_ACKS_ON_FAILURE="0",
        CELERY_WORKER_QUEUES=f"{first},{second}",
        IT_BROKER_URL=broker_url(server, *enforced.broker),
        AWS_ACCESS_KEY_ID=enforced.broker[0],
        AWS_SECRET_ACCESS_KEY=enforced.broker[1],
    ) as process:
        # Each failed task runs twice: released after each run, dead-lettered at the third receive.
        beds[first].wait_for_executions(8, timeout=40)
        settled = settle(
            lambda: (
                all(dead_letter_count(enforced.sqs(enforced.ops), queue) == 1 for queue in beds)
                and all(long_task_deleted(server, q) for q in beds)
                and not enforced.objects()
            ),
        )
        log = process.log
    elapsed = time.monotonic() - started

    # The worker's calls: the producer here is ops, and its sends are not the subject.
    calls = [c for c in enforced.recorded()[recorded_before:] if c.access_key_id != enforced.ops[0]]
    refused = refused_since(server, refused_before)
    on_queue = {queue: [c for c in calls if c.queue_url == enforced.urls[queue]] for queue in beds}
    keys_used = {
        queue: collections.Counter((c.action, c.access_key_id) for c in queue_calls)
        for queue, queue_calls in on_queue.items()
    }
    broker_calls = collections.Counter(
        c.action for c in calls if c.access_key_id == enforced.broker[0]
    )
    s3_keys = {
        queue: collections.Counter(
            (c.action, c.access_key_id) for c in calls if c.service == "s3" and key in c.objects
        )
        for queue, (_, key) in large.items()
    }
    renewal_events = {
        queue: sum(
            1
            for events in renewed_messages(server, queue)
            for e in events
            if e["action"] == "change_visibility" and e["visibility"] == LEASE
        )
        for queue in beds
    }
    report(
        "per-queue keys",
        runs=beds[first].runs_per_task(),
        renewals=renewal_events,
        releases={queue: len(confirmed_releases(server, queue)) for queue in beds},
        calls_by_action_and_key={q: dict(c) for q, c in keys_used.items()},
        s3_calls_by_action_and_key={q: dict(c) for q, c in s3_keys.items()},
        broker_key_calls=dict(broker_calls),
        refused=len(refused),
        first_refused=refused[:1],
        seconds=round(elapsed, 1),
    )

    assert beds[first].runs_per_task() == {
        long_tasks[first]: 1,
        long_tasks[second]: 1,
        failing[first]: 2,
        failing[second]: 2,
        large[first][0]: 1,
        large[second][0]: 1,
    }
    assert refused == []
    assert settled, "tasks not dead-lettered, long tasks not deleted, or objects left"
    # Each large body was read, and its object deleted, with its queue's key alone.
    for queue, used in s3_keys.items():
        own_key = enforced.queue_keys[queue][0]
        assert set(used) == {("s3:GetObject", own_key), ("s3:DeleteObjects", own_key)}, s3_keys
    assert {c.access_key_id for c in calls if c.service == "s3"} <= {
        keys[0] for keys in enforced.queue_keys.values()
    }
    for queue in beds:
        own_key = enforced.queue_keys[queue][0]
        # Every call on the queue, receives, renewals, releases and deletes, with its key.
        assert {key for _, key in keys_used[queue]} == {own_key}, keys_used[queue]
        actions = {action for action, _ in keys_used[queue]}
        assert {"ReceiveMessage", "ChangeMessageVisibilityBatch", "DeleteMessageBatch"} <= actions
        long_task = renewed_message(server, queue)
        assert renewal_events[queue] >= 3, long_task  # 9 s of work under a 3 s lease
        assert lapses(long_task) == [], long_task
        assert len(confirmed_releases(server, queue)) == 2
        assert dead_letter_count(enforced.sqs(enforced.ops), queue) == 1
    assert "AccessDenied" not in log
    assert_no_secret_in(log, enforced.broker, *enforced.queue_keys.values())


@pytest.mark.skipif(
    not hasattr(SQS.Channel, "generate_sts_session_token_with_buffer"),
    reason="kombu 5.5 has no sts_token_buffer_time, and AssumeRole's 900 s minimum "
    "would put the first refresh 15 minutes into the test",
)
def test_sts_role_credentials_are_followed_through_refreshes(
    enforced: Setup, tmp_path: Path
) -> None:
    server = enforced.server
    queue = enforced.role_queue
    bed = enforced.bed(queue, tmp_path)
    refused_before = len(server.refused_calls())
    recorded_before = len(enforced.recorded())
    long_seconds = 3 * TOKEN_LIFETIME  # three role sessions long
    long_task = enforced.send(bed, "busy", "long", long_seconds)
    started = time.time()
    with worker(
        bed,
        "threads",
        2,
        "sts-role",
        options={
            "visibility_timeout": LEASE,
            "release_on_failure": True,
            "predefined_queues": {queue: {"url": enforced.urls[queue]}},
            "sts_role_arn": enforced.role_arn,
            "sts_token_timeout": STS_TOKEN_TIMEOUT,
            "sts_token_buffer_time": STS_TOKEN_TIMEOUT - TOKEN_LIFETIME,
            **LARGE_PAYLOADS,
        },
        IT_ACKS_ON_FAILURE="0",
        IT_BROKER_URL=broker_url(server, *enforced.sts_base),
        AWS_ACCESS_KEY_ID=enforced.sts_base[0],
        AWS_SECRET_ACCESS_KEY=enforced.sts_base[1],
        # kombu makes its STS client with a plain boto3.client("sts").
        AWS_ENDPOINT_URL_STS=server.endpoint_url,
    ) as process:

        def assumed() -> list[Call]:
            return [
                c
                for c in enforced.recorded()[recorded_before:]
                if c.action == "AssumeRole" and c.access_key_id == enforced.sts_base[0]
            ]

        # Sent after the first refresh, so that its releases, and the large task's S3
        # read and delete, need the new credentials.
        assert settle(lambda: len(assumed()) >= 2, timeout=30), "the role was never re-assumed"
        failing = enforced.send(bed, "fails", "failed", "error")
        large, large_key = enforced.send_large(bed, "large")
        bed.wait_for_executions(4, timeout=long_seconds + 30)
        settled = settle(
            lambda: (
                dead_letter_count(enforced.sqs(enforced.ops), queue) == 1
                and long_task_deleted(server, queue)
                and not enforced.objects()
            ),
        )
        log = process.log
    elapsed = time.time() - started

    # The worker's calls: the producer here is ops, and its sends are not the subject.
    calls = [c for c in enforced.recorded()[recorded_before:] if c.access_key_id != enforced.ops[0]]
    refused = refused_since(server, refused_before)
    assume_roles = [c for c in calls if c.action == "AssumeRole"]
    on_queue = [c for c in calls if c.queue_url == enforced.urls[queue]]
    on_s3 = [c for c in calls if c.service == "s3"]
    role_calls = [c for c in calls if c in on_queue or c in on_s3]
    role_keys = list(dict.fromkeys(c.access_key_id for c in role_calls))  # in order of first use
    use_spans = {
        key: max(c.signed_at for c in role_calls if c.access_key_id == key)
        - min(c.signed_at for c in role_calls if c.access_key_id == key)
        for key in role_keys
    }
    renewals = [
        c
        for c in on_queue
        if c.action == "ChangeMessageVisibilityBatch" and LEASE in c.visibilities
    ]
    release_calls = [
        c for c in on_queue if c.action == "ChangeMessageVisibilityBatch" and 0 in c.visibilities
    ]
    deletes = [c for c in on_queue if c.action == "DeleteMessageBatch"]
    long_events = renewed_message(server, queue)
    # Only the long task is held for long. Another message may be renewed once a receive:
    # a short task's lease fills a renewal call of the long task's, or is renewed while
    # its delete is on the wire (the failing task is received twice).
    others_renewed = [
        sum(e["action"] == "change_visibility" and e["visibility"] == LEASE for e in events)
        for events in renewed_messages(server, queue)
        if events != long_events
    ]
    refreshed_at = assume_roles[1].signed_at
    report(
        "sts role",
        runs=bed.runs_per_task(),
        assume_role_calls=len(assume_roles),
        role_keys=len(role_keys),
        key_use_spans=sorted(use_spans.values()),
        renewals_by_key=dict(
            collections.Counter(role_keys.index(c.access_key_id) for c in renewals)
        ),
        releases_by_key=dict(
            collections.Counter(role_keys.index(c.access_key_id) for c in release_calls)
        ),
        deletes_by_key=dict(collections.Counter(role_keys.index(c.access_key_id) for c in deletes)),
        s3_calls_by_key=dict(
            collections.Counter((c.action, role_keys.index(c.access_key_id)) for c in on_s3)
        ),
        renewal_events_after_refresh=sum(
            1
            for e in long_events
            if e["action"] == "change_visibility" and e["t"] > refreshed_at + 1
        ),
        refused=len(refused),
        first_refused=refused[:1],
        seconds=round(elapsed, 1),
    )

    assert bed.runs_per_task() == {long_task: 1, failing: 2, large: 1}
    assert refused == []
    assert all(count <= 2 for count in others_renewed), others_renewed
    assert settled, "the failed task not dead-lettered, the long task or the object not deleted"
    # kombu re-assumed the role during the long task: 15 s of work, 6 s per session.
    assert len(assume_roles) >= 3, assume_roles
    assert {c.access_key_id for c in assume_roles} == {enforced.sts_base[0]}
    # Every call on the queue and to S3 with the role's credentials, never the base key ...
    assert all(c.has_session_token for c in role_calls)
    assert enforced.sts_base[0] not in role_keys
    # ... and with the current ones: no key signed calls for longer than kombu keeps it.
    # X-Amz-Date has whole seconds, and a call may take the old client while another thread
    # is replacing it (kombu's sqs() has no lock), hence 2 s to spare; a client kept over
    # one refresh would show 12 s. Had the session really ended, AWS would refuse the call.
    assert max(use_spans.values()) <= TOKEN_LIFETIME + 2, use_spans
    # Renewals went on with refreshed credentials, and the lease never lapsed.
    assert len({c.access_key_id for c in renewals}) >= 2, renewals
    assert lapses(long_events) == [], long_events
    assert any(
        e["action"] == "change_visibility" and e["result"] == "ok" and e["t"] > refreshed_at + 1
        for e in long_events
    ), long_events
    # The releases and the delete were signed with a role key newer than the first.
    assert len(release_calls) == 2 and len(confirmed_releases(server, queue)) == 2
    assert all(c.access_key_id != role_keys[0] for c in release_calls + deletes)
    assert deletes, on_queue
    # The large task's object was read and deleted with a role key newer than the first.
    s3_use = [(c.action, c.objects) for c in on_s3]
    assert s3_use == [("s3:GetObject", (large_key,)), ("s3:DeleteObjects", (large_key,))], on_s3
    assert all(c.access_key_id != role_keys[0] for c in on_s3)
    assert dead_letter_count(enforced.sqs(enforced.ops), queue) == 1
    assert "AccessDenied" not in log
    assert "ExpiredToken" not in log
    assert_no_secret_in(log, enforced.sts_base)
