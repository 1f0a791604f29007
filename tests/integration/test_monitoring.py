"""Monitoring over SQS as a user runs it: ``celery events --dump`` against a ``-E`` worker,
a monitor's own routing key, and what the monitors and the worker leave behind."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import boto3
from celery import Celery
from kombu import Producer

from tests.integration.harness import (
    REPO,
    Bed,
    as_from_a_terminal,
    needs_sns_fanout,
    stop_or_show_stacks,
    wait_for,
    worker,
)
from tests.ports import free_port

LEASE = 3
CELERY = [sys.executable, "-m", "celery", "-A", "tests.integration.app"]
OPTIONS = {"visibility_timeout": LEASE, "supports_fanout": True, "events_through_sns": True}


class Process:
    """A ``celery`` command of the test app, its output in ``<name>.log`` under the bed."""

    def __init__(
        self, bed: Bed, name: str, *args: str, options: dict[str, Any], **env: str
    ) -> None:
        self.path = bed.logs / f"{name}.log"
        self._out = self.path.open("w")
        self.process = subprocess.Popen(
            [*CELERY, *args],
            cwd=REPO,
            env=bed.env(options=options, **env),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            preexec_fn=as_from_a_terminal,
        )

    @property
    def output(self) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        try:
            return stop_or_show_stacks(self.process, sig, timeout, self.path)
        finally:
            self._out.close()


def run_celery(
    bed: Bed, *args: str, options: dict[str, Any], timeout: float, **env: str
) -> subprocess.CompletedProcess[str]:
    """A ``celery`` command of the test app run to its end, as an operator runs it."""
    return subprocess.run(
        [*CELERY, *args],
        cwd=REPO,
        env=bed.env(options=options, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_worker(bed: Bed, name: str, *args: str, options: dict[str, Any], **env: str) -> Process:
    """``celery worker`` of the test app as node ``name`` (its log ``<name>.log``), with
    ``args`` such as its pool, once it is ready (killed if it never is)."""
    worker = Process(
        bed,
        name,
        "worker",
        *args,
        "-n",
        f"{name}@%h",
        "-l",
        "info",
        "--without-mingle",
        "--without-gossip",
        options=options,
        **env,
    )
    try:
        wait_for(lambda: "ready." in worker.output, 60, f"{name} to be ready")
    except BaseException:
        worker.stop(signal.SIGKILL)
        raise
    return worker


@contextmanager
def monitored_worker(
    bed: Bed, name: str, options: dict[str, Any] = OPTIONS, **env: str
) -> Iterator[Process]:
    """A prefork worker sending task events (``-E``) and heartbeats, as Flower needs.

    ``env``: more environment, such as the AWS keys of an IAM user.
    """
    worker = start_worker(bed, name, "-E", "-P", "prefork", "-c", "1", options=options, **env)
    try:
        yield worker
    finally:
        assert worker.stop() == 0, worker.output


@contextmanager
def events_dump(bed: Bed, **env: str) -> Iterator[Process]:
    """``celery events --dump``, once the worker's answer to its wake-up shows it listens."""
    dump = Process(bed, "events-dump", "events", "--dump", options=OPTIONS, **env)
    try:
        wait_for(lambda: "heartbeat" in dump.output, 30, "a worker heartbeat in the dump")
        yield dump
    finally:
        # Ctrl-C, as a user stops it: the consumer is cancelled and its queue removed.
        dump.stop(signal.SIGINT)


@contextmanager
def in_process_app(bed: Bed) -> Iterator[Celery]:
    """A Celery app of this process, with the options of the monitors."""
    with bed.client_app("monitor", transport_options={"wait_time_seconds": 1, **OPTIONS}) as app:
        yield app


@contextmanager
def receiver(bed: Bed, routing_key: str) -> Iterator[list[dict[str, Any]]]:
    """Celery's own event receiver in this process, bound with ``routing_key``."""
    seen: list[dict[str, Any]] = []
    with in_process_app(bed) as app, app.connection_for_read() as connection:
        events = app.events.Receiver(
            connection, routing_key=routing_key, handlers={"*": seen.append}
        )
        capture = threading.Thread(target=events.capture, kwargs={"wakeup": True})
        capture.start()
        try:
            yield seen
        finally:
            events.should_stop = True
            capture.join(30)


def socket_host() -> str:
    """The ``%h`` of a worker's name, as kombu spells it in an SQS queue name."""
    return socket.gethostname().replace(".", "-")


def sns(bed: Bed) -> Any:
    return boto3.client("sns", **bed.server.boto3_kwargs)


def event_subscriptions(bed: Bed) -> list[str]:
    """The queues subscribed to the SNS topic of Celery's events."""
    return [
        s["Endpoint"]
        for s in sns(bed).list_subscriptions()["Subscriptions"]
        if s["TopicArn"].endswith(":celeryev")
    ]


def queues_and_subscriptions(bed: Bed) -> tuple[set[str], set[str]]:
    queues = set(bed.sqs().list_queues().get("QueueUrls", []))
    subscriptions = {
        f"{s['TopicArn'].rsplit(':', 1)[1]} -> {s['Endpoint'].rsplit(':', 1)[1]}"
        for s in sns(bed).list_subscriptions()["Subscriptions"]
    }
    return queues, subscriptions


@needs_sns_fanout
def test_celery_events_dump_shows_a_tasks_events_and_a_monitor_gets_only_its_routing_key(
    bed: Bed,
) -> None:
    with monitored_worker(bed, f"ev{uuid.uuid4().hex[:6]}"), events_dump(bed) as dump:
        listening = len(event_subscriptions(bed))
        with receiver(bed, "task.#") as task_events:
            wait_for(lambda: len(event_subscriptions(bed)) > listening, 30, "its subscription")
            heartbeats = dump.output.count("heartbeat")
            task_id = bed.send("busy", "short", 0.1)
            wait_for(
                lambda: any(
                    e.get("uuid") == task_id and e["type"] == "task-succeeded" for e in task_events
                ),
                30,
                "task-succeeded in the receiver",
            )
            # A heartbeat sent while the monitor listened: SNS gave it to its queue too.
            wait_for(lambda: dump.output.count("heartbeat") > heartbeats, 30, "a heartbeat")
        output = dump.output

    for event in ("task received", "task started", "task succeeded"):
        assert f"{event}: tests.integration.app.busy({task_id})" in output, output
    types = {event["type"] for event in task_events}
    assert {"task-received", "task-started", "task-succeeded"} <= types, types
    # The worker's heartbeats reached the dump (bound with "#"), not this "task.#" monitor.
    assert all(kind.startswith("task-") for kind in types), types


@needs_sns_fanout
def test_monitors_leave_nothing_and_a_stopped_worker_only_its_subscribed_mailbox(
    bed: Bed,
) -> None:
    name = f"cl{uuid.uuid4().hex[:6]}"
    queues_before, subscriptions_before = queues_and_subscriptions(bed)
    with monitored_worker(bed, name):
        with events_dump(bed):
            _, subscriptions_during = queues_and_subscriptions(bed)
        ping = run_celery(bed, "inspect", "ping", "--timeout", "5", options=OPTIONS, timeout=60)
        assert f"{name}@" in ping.stdout, ping.stdout + ping.stderr
    queues_after, subscriptions_after = queues_and_subscriptions(bed)

    # While they ran, the dump and the worker's mailbox were subscribed.
    assert {s.split(" -> ")[0] for s in subscriptions_during - subscriptions_before} == {
        "celeryev",
        "celery-pidbox",
    }, subscriptions_during
    # The worker's mailbox, still subscribed: another worker of its name may read it.
    mailbox = f"{name}_{socket_host()}-celery-pidbox"
    added = subscriptions_after - subscriptions_before
    assert added == {f"celery-pidbox -> {mailbox}"}, added
    left = sorted(url.rsplit("/", 1)[1] for url in queues_after - queues_before)
    # The task queue, and the worker's mailbox: its name comes back at its next start.
    assert left == sorted([bed.queue, mailbox]), left


#: Remote control only: what a worker needs to answer ``inspect`` and ``control``.
REMOTE_CONTROL = {"visibility_timeout": LEASE, "supports_fanout": True}


@contextmanager
def solo_worker(bed: Bed, log: str, node: str) -> Iterator[Process]:
    """A solo worker named ``node``, with remote control; ``log`` names its log file."""
    process = Process(
        bed,
        log,
        "worker",
        "-P",
        "solo",
        "-n",
        node,
        "-l",
        "info",
        "--without-heartbeat",
        "--without-mingle",
        "--without-gossip",
        options=REMOTE_CONTROL,
    )
    try:
        wait_for(lambda: "ready." in process.output, 30, f"{log} to be ready")
        yield process
    finally:
        process.stop()


@needs_sns_fanout
def test_a_worker_restarted_under_the_same_name_answers_once_the_old_one_has_stopped(
    bed: Bed,
) -> None:
    """A blue/green restart on one host: two workers of one name share one mailbox queue,
    and SNS hands back the same subscription for it. The old one's warm stop unsubscribed
    it, and no broadcast reached the new one ("No nodes replied")."""
    name = f"dup{uuid.uuid4().hex[:6]}"
    node = f"{name}@{socket.gethostname()}"
    with (
        solo_worker(bed, "worker-blue", f"{name}@%h") as blue,
        solo_worker(bed, "worker-green", f"{name}@%h") as green,
    ):
        assert blue.stop() == 0, blue.output
        with in_process_app(bed) as app, app.connection_for_write() as connection:
            answers = [
                app.control.ping(destination=[node], timeout=10, connection=connection)
                for _ in range(2)
            ]
        log = green.output

    assert answers == [[{node: {"ok": "pong"}}]] * 2, f"{answers}\n{log}"


def test_a_worker_without_remote_control_says_so_once_at_start_up(bed: Bed) -> None:
    with worker(bed, "threads", 1, options={"visibility_timeout": LEASE}) as process:
        log = process.log

    assert log.count("Remote control is off on SQS: celery inspect, celery control") == 1, log


#: One process asking a worker three times through one mailbox, kombu's own API: every
#: call names its reply queue alike. (Celery's ``inspect()`` copies the mailbox for each
#: call, and the id of the copy is part of the name: the name comes back whenever the
#: copy lands where the last one was, as it often does in CPython, but not always.)
PING_THRICE = """
import json, sys
from tests.integration.app import app
with app.connection_for_write() as connection:
    mailbox = app.control.mailbox(connection)
    print(json.dumps([mailbox.call([sys.argv[1]], "ping", timeout=10) for _ in range(3)]))
"""


def reply_queues(bed: Bed) -> set[str]:
    urls = bed.sqs().list_queues().get("QueueUrls", [])
    return {url.rsplit("/", 1)[1] for url in urls if url.endswith("-reply-celery-pidbox")}


@needs_sns_fanout
def test_one_process_asks_a_worker_three_times_and_leaves_no_reply_queue_at_its_exit(
    bed: Bed,
) -> None:
    """SQS refuses for a minute a queue name deleted just before: kombu deleted the reply
    queue after each call, so the second call of the process failed with
    ``QueueDeletedRecently``. The queue is kept between calls and goes at the exit."""
    name = f"pt{uuid.uuid4().hex[:6]}"
    node = f"{name}@{socket.gethostname()}"
    before = reply_queues(bed)
    with monitored_worker(bed, name):
        asking = subprocess.run(
            [sys.executable, "-c", PING_THRICE, node],
            cwd=REPO,
            env=bed.env(options=OPTIONS),
            capture_output=True,
            text=True,
            timeout=90,
        )
    left = reply_queues(bed) - before

    assert asking.returncode == 0, asking.stderr
    answers = json.loads(asking.stdout.splitlines()[-1])
    assert answers == [[{node: {"ok": "pong"}}]] * 3, answers
    assert left == set(), left


@needs_sns_fanout
def test_a_late_reply_to_a_reply_queue_deleted_just_now_is_dropped_and_the_worker_answers_on(
    bed: Bed,
) -> None:
    """The one who asked has left, and its reply queue went with it, a moment ago.

    The worker's reply created the queue again, which SQS refuses for a minute
    (``QueueDeletedRecently``); the error reached Celery's remote control, which logged
    it and restarted its consumer. The reply is dropped, as a broker drops a message
    routed to no queue."""
    name = f"lr{uuid.uuid4().hex[:6]}"
    node = f"{name}@{socket.gethostname()}"
    gone = str(uuid.uuid4())  # the routing key of an asker that left
    sqs = bed.sqs()
    with monitored_worker(bed, name) as worker:
        reply_queue = sqs.create_queue(QueueName=f"{gone}-reply-celery-pidbox")["QueueUrl"]
        sqs.delete_queue(QueueUrl=reply_queue)
        with in_process_app(bed) as app, app.connection_for_write() as connection:
            mailbox = app.control.mailbox(connection)
            late = {"exchange": mailbox.reply_exchange.name, "routing_key": gone}
            Producer(connection.default_channel).publish(
                {
                    "method": "ping",
                    "arguments": {},
                    "destination": [node],
                    "ticket": "late",
                    "reply_to": late,
                },
                exchange=mailbox.exchange,
                declare=[mailbox.exchange],
                serializer="json",
                headers={"clock": 0, "expires": 0},
            )
            # Asked after the late one: the worker has handled both once this answers.
            answers = mailbox.call([node], "ping", timeout=10)
        log = worker.output

    assert answers == [{node: {"ok": "pong"}}], log
    assert "Control command error" not in log, log
    assert "Traceback" not in log, log


@needs_sns_fanout
def test_pool_children_that_asked_the_workers_leave_no_reply_queue(bed: Bed) -> None:
    """billiard ends a pool child with ``os._exit``, which runs no exit handler: each
    child that had called ``inspect`` left its reply queue behind for good."""
    before = reply_queues(bed)
    process = Process(
        bed,
        "worker-children",
        "worker",
        "-P",
        "prefork",
        "-c",
        "1",
        # A fresh child for every task: each asks from a process of its own.
        "--max-tasks-per-child",
        "1",
        "-n",
        f"rq{uuid.uuid4().hex[:6]}@%h",
        "-l",
        "info",
        "--without-heartbeat",
        "--without-mingle",
        "--without-gossip",
        options=REMOTE_CONTROL,
    )
    try:
        wait_for(lambda: "ready." in process.output, 30, "the worker to be ready")
        for index in range(3):
            bed.send("inspects_the_workers", f"inspect-{index}")
        done = bed.wait_for_executions(3, 60)
    finally:
        assert process.stop() == 0, process.output
    left = reply_queues(bed) - before

    assert len({record["pid"] for record in done}) == 3, (done, process.output)
    assert left == set(), left


@contextmanager
def flower(bed: Bed) -> Iterator[str]:
    """A Flower process on a free port of 127.0.0.1; yields its URL once it serves."""
    port = free_port()
    process = Process(
        bed,
        f"flower-{port}",
        "flower",
        f"--port={port}",
        "--address=127.0.0.1",
        options=OPTIONS,
        FLOWER_UNAUTHENTICATED_API="true",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(f"{url}/healthcheck"), 30, "Flower to serve")
        yield url
    finally:
        # Ctrl-C, as a user stops it: Flower stops its event capture and exits.
        assert process.stop(signal.SIGINT) is not None, process.output


def _answers(url: str) -> bool:
    try:
        with _no_proxy.open(url, timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


#: Flower serves on 127.0.0.1 only: never through a configured proxy.
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def api(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with _no_proxy.open(request, timeout=30) as answer:
        return json.loads(answer.read() or b"null")


def task_state(url: str, task_id: str) -> str | None:
    state: str | None = api(f"{url}/api/tasks").get(task_id, {}).get("state")
    return state


@needs_sns_fanout
def test_flower_shows_the_worker_and_its_tasks_and_revokes_one(bed: Bed) -> None:
    name = f"fl{uuid.uuid4().hex[:6]}"
    with monitored_worker(bed, name), flower(bed) as url:
        wait_for(lambda: any(name in w for w in api(f"{url}/api/workers?refresh=1")), 30, "worker")
        done = bed.send("busy", "short", 0.1)
        wait_for(lambda: task_state(url, done) == "SUCCESS", 30, "the task's success in Flower")
        running = bed.send("busy", "long", 60)
        wait_for(lambda: task_state(url, running) == "STARTED", 30, "the long task started")
        api(f"{url}/api/task/revoke/{running}?terminate=true", "POST")
        wait_for(lambda: task_state(url, running) == "REVOKED", 30, "the revoke in Flower")


def new_subscription(bed: Bed, listening: set[str]) -> bool:
    """Whether a queue not in ``listening`` is subscribed to the events' topic now."""
    return bool(set(event_subscriptions(bed)) - listening)


@needs_sns_fanout
def test_starting_and_stopping_flower_five_times_leaves_no_queue_or_subscription(
    bed: Bed,
) -> None:
    """Flower never cancels its event consumer: its queue went only at its exit.

    Other tests' leftovers may be reaped meanwhile (a subscription whose queue is gone),
    so the check is that nothing was added, not that nothing changed.
    """
    queues_before, subscriptions_before = queues_and_subscriptions(bed)
    for _ in range(5):
        listening = set(event_subscriptions(bed))
        with flower(bed) as url:
            wait_for(partial(new_subscription, bed, listening), 30, "its subscription")
            assert api(f"{url}/api/tasks") == {}
    queues_after, subscriptions_after = queues_and_subscriptions(bed)

    assert queues_after <= queues_before, queues_after - queues_before
    assert subscriptions_after <= subscriptions_before, subscriptions_after - subscriptions_before
