"""Celery's message signing through this transport, end to end (issue 32, item 4).

Workers and producers call ``app.setup_security()`` (``tests/integration/app.py`` with
``IT_SECURITY_DIR``): every task message is signed with a key whose certificate is in
the store, and a worker accepts nothing else. Signed tasks go through the paths where
this transport handles the bytes itself: a body in S3, a ``SendMessageBatch``, a park in
SQS (and a fresh copy of a parked one), a release and a retry that the worker
publishes; each runs once. A message sent straight to the queue, unsigned or with signed
bytes changed, runs nothing, and the worker goes on. What a signature does not cover
(the task's headers, a second send of the same bytes) is pinned too, as
``docs/security.md`` says. Every count comes from the tasks' own records and the strict
server; no test assumes a timing.
"""

from __future__ import annotations

import base64
import collections
import datetime
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests.integration.harness import (
    REPO,
    UNDELAYED,
    Bed,
    assert_queue_empty,
    report,
    settle,
    wait_for,
    worker,
)
from tests.integration.test_large_payloads import LARGE, new_bucket, objects
from tests.integration.test_release_on_failure import dead_lettered

LEASE = 10
#: A countdown further away than this is parked; the parked task comes back 1 s early.
THRESHOLD = 2
#: Far enough beyond the threshold that the task is still due later when a busy machine's
#: worker receives it, so it is parked rather than held.
COUNTDOWN = 20
#: The longest one receive hides a task (``visibility_extension_max``): a countdown of
#: several is parked, comes back, and is parked again.
HOP = 4
#: How early, by the wall clock, a task may start: see ``test_parking.EARLY_START``.
EARLY_START = 0.5
#: What Celery's ``auth`` serializer puts between the parts of a signed body.
SEPARATOR = b"\x00\x01"
#: Generous failure guards, not timings: waits return as soon as their condition holds.
GUARD = 60


def signing_keys(tmp_path: Path) -> Path:
    """A self-signed RSA key and certificate, and a store of that certificate alone.

    Laid out as ``tests/integration/app.py`` reads ``IT_SECURITY_DIR``. Celery's ``auth``
    serializer takes RSA only; it checks no chain, so no CA is needed.
    """
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "celery-it-signer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    directory = tmp_path / "security"
    (directory / "store").mkdir(parents=True)
    (directory / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (directory / "cert.pem").write_bytes(pem)
    (directory / "store" / "signer.pem").write_bytes(pem)
    return directory


def publish(
    bed: Bed, keys: Path, options: dict[str, Any], tasks: list[dict[str, Any]], batched: bool
) -> list[str]:
    """Publish ``tasks`` from a signing producer process of their own; their task ids."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.signed_producer"],
        input=json.dumps({"batched": batched, "tasks": tasks}),
        cwd=REPO,
        env=bed.env(options=options, IT_SECURITY_DIR=keys),
        capture_output=True,
        text=True,
        timeout=GUARD,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    ids: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return ids


def signed_worker(bed: Bed, keys: Path, pool: str, options: dict[str, Any], **env: Any) -> Any:
    return worker(bed, pool, 1, options=options, IT_SECURITY_DIR=keys, **env)


def receives_per_message(bed: Bed) -> dict[str, int]:
    """How often the server handed out each message of the bed's queue."""
    return dict(
        collections.Counter(
            event["message_id"]
            for event in bed.server.events()
            if event["queue"].endswith(bed.queue) and event["action"] == "receive"
        )
    )


def queue_drained(bed: Bed) -> bool:
    """Nothing left in the queue, visible or in flight: no copy can be received any more."""
    try:
        assert_queue_empty(bed)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_signed_tasks_run_once_through_s3_a_batch_and_a_park(
    bed: Bed, tmp_path: Path, pool: str
) -> None:
    keys = signing_keys(tmp_path)
    bucket = new_bucket(bed)
    options = {
        "visibility_timeout": LEASE,
        "eta_parking_threshold": THRESHOLD,
        "large_payload_bucket": bucket,
        "large_payload_prefix": "tasks/",
        # Published undelayed, so that the countdown is received and parked.
        **UNDELAYED,
    }
    bed.create_queue(visibility_timeout=LEASE)
    with signed_worker(bed, keys, pool, options) as process:
        [large] = publish(
            bed, keys, options, [{"task": "sized", "args": ["large", "x" * LARGE]}], False
        )
        # Parked before the batch arrives: a solo worker that received it behind twelve
        # tasks could find it due and hold it instead.
        parked_at = datetime.datetime.now(datetime.timezone.utc).timestamp()
        due_later = {"task": "busy", "args": ["parked", 0], "countdown": COUNTDOWN}
        [parked] = publish(bed, keys, options, [due_later], False)
        parking = f"Parking task tests.integration.app.busy[{parked}] in SQS"
        settle(lambda: parking in process.log, GUARD)
        bed.server.reset_calls()
        batch = publish(
            bed, keys, options, [{"task": "busy", "args": [f"b{n}", 0]} for n in range(12)], True
        )
        batch_calls = bed.server.calls()
        sent = [large, *batch, parked]
        bed.wait_for_executions(len(sent), timeout=GUARD)
        # Until no copy of any of them can come: the queue holds none, hidden or not.
        drained = settle(lambda: queue_drained(bed), GUARD)
        left_in_s3 = objects(bed, bucket)
        log = process.log
    runs = bed.runs_per_task()
    outcomes = {record["task_id"]: record["outcome"] for record in bed.executions()}
    start = {record["task_id"]: record["start"] for record in bed.executions()}
    report(f"signing/{pool}", runs=runs, calls=batch_calls, s3=left_in_s3)
    assert drained, log
    assert runs == {task_id: 1 for task_id in sent}, log
    assert outcomes[large] == f"ok:{LARGE}", log
    assert batch_calls.get("SendMessageBatch", 0) == 2 and "SendMessage" not in batch_calls
    assert parking in log, log
    assert start[parked] >= parked_at + COUNTDOWN - EARLY_START, (start[parked], parked_at)
    assert left_in_s3 == []
    assert "SecurityError" not in log and "ContentDisallowed" not in log, log


def test_a_signed_task_released_on_failure_then_retried_runs_to_success(
    bed: Bed, tmp_path: Path
) -> None:
    """Released by ``release_on_failure`` (the same signed bytes come back), then retried
    by ``self.retry()`` (a new message the worker signs), then successful."""
    keys = signing_keys(tmp_path)
    options = {"visibility_timeout": LEASE, "release_on_failure": True}
    bed.create_queue(visibility_timeout=LEASE)
    with signed_worker(bed, keys, "prefork", options, IT_ACKS_ON_FAILURE="0") as process:
        flaky = {"task": "released_then_retried", "args": ["r"]}
        [task] = publish(bed, keys, options, [flaky], False)
        wait_for(lambda: any(r["outcome"] == "ok" for r in bed.executions()), GUARD, "success")
        drained = settle(lambda: queue_drained(bed), GUARD)
        log = process.log
    receives = receives_per_message(bed)
    report("signing/release", outcomes=[r["outcome"] for r in bed.executions()], receives=receives)
    assert drained, log
    assert [(r["task_id"], r["outcome"]) for r in bed.executions()] == [
        (task, "failed"),
        (task, "retrying"),
        (task, "ok"),
    ], log
    # The original twice (its release), the worker's retry once.
    assert sorted(receives.values()) == [1, 2], receives
    assert "SecurityError" not in log and "ContentDisallowed" not in log, log


def captured(bed: Bed, keys: Path, label: str) -> dict[str, Any]:
    """A task message as a signing producer sent it, taken out of the queue: its SQS body."""
    publish(bed, keys, {}, [{"task": "busy", "args": [label, 0]}], False)
    sqs = bed.sqs()
    url = sqs.get_queue_url(QueueName=bed.queue)["QueueUrl"]
    [message] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    envelope: dict[str, Any] = json.loads(base64.b64decode(message["Body"]))
    assert envelope["content-type"] == "application/data", envelope  # the auth serializer's
    return envelope


def as_body(envelope: dict[str, Any]) -> str:
    """An SQS body as kombu sends one: the JSON envelope, base64-encoded."""
    return base64.b64encode(json.dumps(envelope).encode()).decode()


def signed_parts(envelope: dict[str, Any]) -> list[bytes]:
    """Signer, signature, content type, encoding and the signed body, as Celery packs them."""
    packed = base64.b64decode(base64.b64decode(envelope["body"]))
    return packed.split(SEPARATOR, 4)


def with_body(envelope: dict[str, Any], label: str, parts: list[bytes] | None) -> dict[str, Any]:
    """A copy under a new task id whose task body is ``busy(label, 0)``.

    With ``parts``, the body is packed with their signature, which signed another body:
    signed bytes changed. Without, it is plain JSON, as an unsigned producer sends it.
    """
    task_body = json.dumps([[label, 0], {}, {}]).encode()
    copy = json.loads(json.dumps(envelope))
    copy["headers"]["id"] = copy["properties"]["correlation_id"] = f"{label}-{uuid.uuid4()}"
    if parts is None:
        copy["content-type"], inner = "application/json", task_body
    else:
        inner = base64.b64encode(SEPARATOR.join([*parts[:4], task_body]))
    copy["body"] = base64.b64encode(inner).decode()
    return copy


@pytest.mark.parametrize("settled", ["kombu-reject", "release-on-failure"])
def test_unsigned_or_changed_messages_run_nothing_and_the_worker_goes_on(
    bed: Bed, tmp_path: Path, settled: str
) -> None:
    """Celery refuses both before any pool sees them; where each message ends differs.

    Unsigned: "Received invalid task message", a reject without requeue, which on a queue
    with a dead-letter queue ends there (released at once with ``release_on_failure``,
    else when its lease runs out). Changed: "Can't decode message body", which Celery
    acks: the message is deleted at its first receive.
    """
    keys = signing_keys(tmp_path)
    releasing = settled == "release-on-failure"
    options = {"visibility_timeout": LEASE, "release_on_failure": releasing}
    url = bed.create_queue(visibility_timeout=LEASE, max_receive_count=2)
    original = captured(bed, keys, "signed")
    forged = {
        "unsigned": with_body(original, "unsigned", None),
        "tampered": with_body(original, "tampered", signed_parts(original)),
    }
    env = {"IT_ACKS_ON_FAILURE": "0"} if releasing else {}
    sqs = bed.sqs()
    with signed_worker(bed, keys, "solo", options, **env) as process:
        message_ids = {
            label: sqs.send_message(QueueUrl=url, MessageBody=as_body(envelope))["MessageId"]
            for label, envelope in forged.items()
        }
        # Until neither can come back: the queue holds nothing, hidden or not.
        drained = settle(lambda: queue_drained(bed), GUARD)
        sqs.send_message(QueueUrl=url, MessageBody=as_body(original))
        bed.wait_for_executions(1, timeout=GUARD)
        settle(lambda: queue_drained(bed), GUARD)
        log = process.log
        alive = process.process.poll() is None
    dead = [json.loads(base64.b64decode(m["Body"]))["headers"]["id"] for m in dead_lettered(bed)]
    receives = receives_per_message(bed)
    labels = [record["name"] for record in bed.executions()]
    report(f"signing/refused/{settled}", labels=labels, dead=dead, receives=receives)
    assert alive and drained, log
    assert labels == ["signed"], log
    assert "Refusing to deserialize untrusted content of type json" in log, log
    assert "Can't decode message body" in log and "SecurityError" in log, log
    assert [task_id.split("-")[0] for task_id in dead] == ["unsigned"], dead
    assert receives[message_ids["unsigned"]] == 2 and receives[message_ids["tampered"]] == 1


def test_a_signature_vouches_for_the_arguments_not_the_task_name_or_how_often(
    bed: Bed, tmp_path: Path
) -> None:
    """Celery signs the task's arguments only: its headers (task name, id, ETA) are not.

    Whoever can read a signed message (``sqs:ReceiveMessage``, or the bucket of its body)
    can send it again, and it runs again; or send it under another task's name, and that
    task runs with those arguments. What ``docs/security.md`` warns of, pinned here.
    """
    keys = signing_keys(tmp_path)
    url = bed.create_queue(visibility_timeout=LEASE)
    original = captured(bed, keys, "signed")
    retargeted = json.loads(json.dumps(original))
    retargeted["headers"]["task"] = "tests.integration.app.fails"
    sqs = bed.sqs()
    with signed_worker(bed, keys, "solo", {"visibility_timeout": LEASE}) as process:
        for envelope in (original, original, retargeted):
            sqs.send_message(QueueUrl=url, MessageBody=as_body(envelope))
        bed.wait_for_executions(3, timeout=GUARD)
        drained = settle(lambda: queue_drained(bed), GUARD)
        log = process.log
    runs = sorted((record["name"], record["outcome"]) for record in bed.executions())
    report("signing/replayed", runs=runs)
    assert drained, log
    assert runs == [("signed", "failed"), ("signed", "ok"), ("signed", "ok")], log


def test_a_signed_task_in_s3_parked_twice_runs_once_from_a_fresh_copy(
    bed: Bed, tmp_path: Path
) -> None:
    """On a queue with a dead-letter queue, a task back from a park and still far from its
    ETA is sent again as a fresh copy of the SQS body, here an S3 pointer: the copy's
    body, read from S3, still carries the producer's signature."""
    keys = signing_keys(tmp_path)
    bucket = new_bucket(bed)
    options = {
        "visibility_timeout": HOP,
        "visibility_extension_max": HOP,
        "eta_parking_threshold": THRESHOLD,
        "large_payload_bucket": bucket,
        # Published undelayed, so that the countdown is received and parked.
        **UNDELAYED,
    }
    bed.create_queue(visibility_timeout=HOP, max_receive_count=2)
    with signed_worker(bed, keys, "solo", options) as process:
        far = {"task": "sized", "args": ["far", "x" * LARGE], "countdown": 3 * HOP}
        [task] = publish(bed, keys, options, [far], False)
        bed.wait_for_executions(1, timeout=GUARD)
        drained = settle(lambda: queue_drained(bed), GUARD)
        left_in_s3 = objects(bed, bucket)
        log = process.log
    outcomes = [(record["task_id"], record["outcome"]) for record in bed.executions()]
    report("signing/fresh-copy", outcomes=outcomes, receives=receives_per_message(bed))
    assert drained, log
    assert outcomes == [(task, f"ok:{LARGE}")], log
    assert "as a fresh copy" in log, log
    assert dead_lettered(bed) == [] and left_in_s3 == []
