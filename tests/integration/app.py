"""The Celery application the integration tests run in real ``celery worker`` processes.

Configured entirely from the environment, as a user would configure theirs from settings,
so that one module serves every pool, transport and option combination.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from typing import Any

from celery import Celery, signals
from celery.exceptions import Reject
from celery.worker.heartbeat import Heart
from kombu import Exchange, Queue


def _transport_options() -> dict[str, Any]:
    """The options as JSON; a backoff_policy's receive counts back to the ints kombu reads."""
    options: dict[str, Any] = json.loads(os.environ.get("IT_TRANSPORT_OPTIONS", "{}"))
    for queue in (options.get("predefined_queues") or {}).values():
        if "backoff_policy" in queue:
            queue["backoff_policy"] = {int(k): v for k, v in queue["backoff_policy"].items()}
    return options


app = Celery("heartbeat_it")
app.conf.update(
    broker_url=os.environ["IT_BROKER_URL"],
    broker_transport=os.environ.get("IT_TRANSPORT", "celery_sqs_heartbeat:Transport"),
    broker_transport_options=_transport_options(),
    # Celery's default retries at start-up; the tests stop at once unless they need it.
    broker_connection_retry_on_startup=os.environ.get("IT_RETRY_ON_STARTUP") == "1",
    task_default_queue=os.environ.get("IT_QUEUE", "it-default"),
    task_acks_late=os.environ.get("IT_ACKS_LATE", "1") == "1",
    task_acks_on_failure_or_timeout=os.environ.get("IT_ACKS_ON_FAILURE", "1") == "1",
    worker_prefetch_multiplier=int(os.environ.get("IT_PREFETCH_MULTIPLIER", "1")),
    # A prefork pool process replaced after this many tasks: forked while the worker consumes.
    worker_max_tasks_per_child=int(os.environ.get("IT_MAX_TASKS_PER_CHILD", "0")) or None,
    worker_hijack_root_logger=False,
)
RECORD_FILE = os.environ.get("IT_RECORD_FILE", os.devnull)

if os.environ.get("IT_TRACE_FILE"):
    # OpenTelemetry's Celery instrumentation, as an application turns it on: the
    # producers' publishes and the workers' task runs become spans (tests/integration/tracing.py).
    from tests.integration.tracing import trace_to_file

    trace_to_file(os.environ["IT_TRACE_FILE"])

if os.environ.get("IT_METRICS_FILE"):
    # An SDK MeterProvider, as an application installs one: the transport's instruments
    # report through it (tests/integration/otel_metrics.py).
    from tests.integration.otel_metrics import metrics_to_file

    metrics_to_file(os.environ["IT_METRICS_FILE"])

if os.environ.get("IT_SECURITY_DIR"):
    # Celery's message signing, set up as its docs say: every message this app sends is
    # signed with the key, and only messages signed by a certificate of the store are
    # accepted. The directory holds ``key.pem``, ``cert.pem`` and ``store/``.
    _security = os.environ["IT_SECURITY_DIR"]
    app.conf.update(
        security_key=os.path.join(_security, "key.pem"),
        security_certificate=os.path.join(_security, "cert.pem"),
        security_cert_store=os.path.join(_security, "store", "*.pem"),
        task_serializer="auth",
        event_serializer="auth",
        accept_content=["auth"],
        result_accept_content=["json"],
    )
    app.setup_security()

if os.environ.get("IT_EXTRA_QUEUE"):
    # A worker of two queues, as ``-Q a,b`` makes one: the default queue and this one.
    app.conf.task_queues = [
        Queue(name, Exchange(name), routing_key=name)
        for name in (app.conf.task_default_queue, os.environ["IT_EXTRA_QUEUE"])
    ]

if os.environ.get("IT_IMPORT_CONTROL") == "1":
    # What a user's app module does so that the ``celery inspect`` command line, which
    # checks command names before it connects, knows ``sqs_leases``. Workers get the
    # commands from the transport, so the tests set this for the command line only.
    import celery_sqs_heartbeat.monitoring.control  # noqa: F401


def _record_start(task_id: str, name: str) -> None:
    """A line in ``IT_START_FILE`` (if set) as the task starts, in the process running it."""
    path = os.environ.get("IT_START_FILE")
    if path:
        with open(path, "a") as starts:
            starts.write(json.dumps({"task_id": task_id, "name": name}) + "\n")


def _record(task_id: str, name: str, started: float, outcome: str) -> None:
    with open(RECORD_FILE, "a") as records:
        records.write(
            json.dumps(
                {
                    "task_id": task_id,
                    "name": name,
                    "pid": os.getpid(),
                    "worker": os.environ.get("IT_WORKER_NAME", ""),
                    "start": started,
                    "end": time.time(),
                    "outcome": outcome,
                }
            )
            + "\n"
        )


@app.task(bind=True)
def busy(self, label: str, seconds: float, padding: str = "") -> str:
    """Stands for a long job: the worker holds its message for ``seconds``.

    ``padding`` makes the message as large as wanted (through S3, past SQS's limit).
    """
    started = time.time()
    _record_start(self.request.id, label)
    time.sleep(seconds)
    _record(self.request.id, label, started, "ok")
    return label


@app.task(bind=True)
def sized(self, label: str, data: str, how: str = "") -> int:
    """Takes a large argument (a body SQS cannot carry) and records the size it got.

    ``how``: "error" fails every run; "retry" retries once, which makes the worker
    publish the large argument again.
    """
    started = time.time()
    if how == "error":
        _record(self.request.id, label, started, "failed")
        raise RuntimeError("failed by the test")
    if how == "retry" and not self.request.retries:
        _record(self.request.id, label, started, "retrying")
        raise self.retry(countdown=0, max_retries=1)
    _record(self.request.id, label, started, f"ok:{len(data)}")
    return len(data)


@app.task(bind=True)
def fails(self, label: str, how: str) -> None:
    """Fails the way a task does when the message should go back to SQS."""
    started = time.time()
    _record(self.request.id, label, started, "failed")
    if how == "reject":
        raise Reject("rejected by the test", requeue=False)
    if how == "requeue":
        raise Reject("requeued by the test", requeue=True)
    raise RuntimeError("failed by the test")


@app.task(bind=True, acks_late=True)
def requeued_once(self, label: str) -> str:
    """Requeues its first delivery and succeeds on the redelivery, as Celery's own suite's
    ``reject_then_succeed`` does: it tells them apart by ``delivery_info["redelivered"]``."""
    started = time.time()
    if not self.request.delivery_info.get("redelivered"):
        _record(self.request.id, label, started, "requeued")
        raise Reject("requeued by the test", requeue=True)
    _record(self.request.id, label, started, "ok")
    return label


@app.task(bind=True)
def retries_later(self, label: str, countdown: float) -> str:
    """Fails once and retries with a countdown: the retry is a new message with an ETA."""
    started = time.time()
    if not self.request.retries:
        _record(self.request.id, f"{label}-first", started, "retry")
        raise self.retry(countdown=countdown)
    _record(self.request.id, label, started, "ok")
    return label


@app.task(bind=True)
def released_then_retried(self, label: str) -> str:
    """Fails its first delivery, retries from the redelivery, and succeeds on the retry.

    With ``release_on_failure`` the failure is a release, so the redelivery is the same
    SQS message; the retry is a new message, which the worker itself publishes.
    """
    started = time.time()
    if not self.request.retries and not self.request.delivery_info.get("redelivered"):
        _record(self.request.id, label, started, "failed")
        raise RuntimeError("failed by the test")
    if not self.request.retries:
        _record(self.request.id, label, started, "retrying")
        raise self.retry(countdown=0, max_retries=1)
    _record(self.request.id, label, started, "ok")
    return label


@app.task(bind=True)
def pings_the_workers(self, label: str) -> int:
    """Asks every worker for a ping from inside a task, on a connection of its own.

    What a task does that checks on the cluster (``app.control.inspect()``, ``ping``): a
    client of the broker in a thread of the worker, which runs its own event loop.
    """
    started = time.time()
    with app.connection_for_write() as connection:
        replies = app.control.ping(timeout=2, connection=connection)
    _record(self.request.id, label, started, f"{len(replies)} replies")
    return len(replies)


@app.task(bind=True)
def inspects_the_workers(self, label: str) -> int:
    """Pings every worker through ``inspect()``, as a task that checks on the cluster does:
    on the app's pooled connection, its reply queue made in the process running the task."""
    started = time.time()
    replies = app.control.inspect(timeout=2).ping() or {}
    _record(self.request.id, label, started, f"{len(replies)} replies")
    return len(replies)


@app.task(bind=True)
def reads_a_queue_of_its_own(self, label: str) -> str:
    """Waits a second for a message on a queue of its own, on a connection it then closes.

    Its poll is still out on the worker's loop when the connection closes, and the queue
    is still there: the poll's answer reaches a closed channel.
    """
    started = time.time()
    with app.connection_for_write() as connection:
        inbox = connection.SimpleQueue(f"{os.environ.get('IT_QUEUE', 'it-default')}-inbox")
        with contextlib.suppress(inbox.Empty):
            inbox.get(timeout=1)
        inbox.close()
    _record(self.request.id, label, started, "ok")
    return label


@app.task(bind=True)
def counts_heartbeats(self, label: str) -> int:
    """Records how many of Celery's heartbeats (``Heart``) this worker process holds, as the
    run's outcome: one for its connection, and one more for each lost connection whose
    heartbeat was never stopped (a gevent worker's, issue 33)."""
    started = time.time()
    gc.collect()
    hearts = sum(1 for held in gc.get_objects() if isinstance(held, Heart))
    _record(self.request.id, label, started, str(hearts))
    return hearts


@signals.worker_ready.connect
def _lose_the_connection_later(sender: Any, **_: Any) -> None:
    """With IT_DROP_CONNECTION_AFTER, break the consumer's connection once, as a network would.

    The error surfaces inside the consumer's loop, where Celery treats it as a lost broker
    connection and restarts it: through the event loop where the worker has one (prefork,
    threads, solo), else (gevent) at the blocking loop's next wait for messages.
    """
    seconds = os.environ.pop("IT_DROP_CONNECTION_AFTER", None)
    if seconds is None:
        return
    if sender.hub is None:
        _fail_a_later_drain(sender.connection, time.monotonic() + float(seconds))
        return

    def lose() -> None:
        raise ConnectionResetError("connection to SQS dropped by the test")

    sender.hub.call_later(float(seconds), sender.hub.call_soon, lose)


def _fail_a_later_drain(connection: Any, at: float) -> None:
    """The first ``drain_events`` from ``at`` on raises, as a reset socket would.

    Celery's blocking loop waits for messages in ``connection.drain_events``, and treats
    what it raises as a lost connection; the consumer connects anew, so this one
    connection is the only one to fail.
    """
    drain = connection.drain_events

    def drain_or_drop(**kwargs: Any) -> Any:
        if time.monotonic() < at:
            return drain(**kwargs)
        del connection.drain_events
        raise ConnectionResetError("connection to SQS dropped by the test")

    connection.drain_events = drain_or_drop
