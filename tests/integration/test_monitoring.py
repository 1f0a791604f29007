"""Monitoring over SQS as a user runs it: ``celery events --dump`` against a ``-E`` worker,
a monitor's own routing key, and what the monitors and the worker leave behind."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from celery import Celery

from .harness import REPO, Bed, needs_sns_fanout, wait_for, worker

LEASE = 3
OPTIONS = {"visibility_timeout": LEASE, "supports_fanout": True, "events_through_sns": True}


class Process:
    """A ``celery`` command of the test app, its output in ``<name>.log`` under the bed."""

    def __init__(self, bed: Bed, name: str, *args: str, options: dict[str, Any]) -> None:
        self.path = bed.logs / f"{name}.log"
        self._out = self.path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.integration.app", *args],
            cwd=REPO,
            env=bed.env(options=options),
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    @property
    def output(self) -> str:
        self._out.flush()
        return self.path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._out.close()


@contextmanager
def monitored_worker(bed: Bed, name: str, options: dict[str, Any] = OPTIONS) -> Iterator[Process]:
    """A prefork worker sending task events (``-E``) and heartbeats, as Flower needs."""
    worker = Process(
        bed,
        "worker-monitored",
        "worker",
        "-E",
        "-P",
        "prefork",
        "-c",
        "1",
        "-n",
        f"{name}@%h",
        "-l",
        "info",
        "--without-mingle",
        "--without-gossip",
        options=options,
    )
    try:
        wait_for(lambda: "ready." in worker.output, 30, "the worker to be ready")
        yield worker
    finally:
        assert worker.stop() == 0, worker.output


@contextmanager
def events_dump(bed: Bed) -> Iterator[Process]:
    """``celery events --dump``, once the worker's answer to its wake-up shows it listens."""
    dump = Process(bed, "events-dump", "events", "--dump", options=OPTIONS)
    try:
        wait_for(lambda: "heartbeat" in dump.output, 30, "a worker heartbeat in the dump")
        yield dump
    finally:
        # Ctrl-C, as a user stops it: the consumer is cancelled and its queue removed.
        dump.stop(signal.SIGINT)


@contextmanager
def receiver(bed: Bed, routing_key: str) -> Iterator[list[dict[str, Any]]]:
    """Celery's own event receiver in this process, bound with ``routing_key``."""
    seen: list[dict[str, Any]] = []
    app = Celery("monitor", set_as_current=False)
    app.conf.update(
        broker_url=bed.server.broker_url,
        broker_transport="celery_sqs_heartbeat:Transport",
        broker_transport_options={
            "region": "us-east-1",
            "is_secure": False,
            "wait_time_seconds": 1,
            **OPTIONS,
        },
    )
    with app, app.connection_for_read() as connection:
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
def test_monitors_and_a_stopped_worker_leave_no_subscription_and_only_the_pidbox_queue(
    bed: Bed,
) -> None:
    name = f"cl{uuid.uuid4().hex[:6]}"
    queues_before, subscriptions_before = queues_and_subscriptions(bed)
    with monitored_worker(bed, name):
        with events_dump(bed):
            _, subscriptions_during = queues_and_subscriptions(bed)
        ping = subprocess.run(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.integration.app",
                "inspect",
                "ping",
                "--timeout",
                "5",
            ],
            cwd=REPO,
            env=bed.env(options=OPTIONS),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f"{name}@" in ping.stdout, ping.stdout + ping.stderr
    queues_after, subscriptions_after = queues_and_subscriptions(bed)

    # While they ran, the dump and the worker's mailbox were subscribed.
    assert {s.split(" -> ")[0] for s in subscriptions_during - subscriptions_before} == {
        "celeryev",
        "celery-pidbox",
    }, subscriptions_during
    assert subscriptions_after == subscriptions_before
    left = sorted(url.rsplit("/", 1)[1] for url in queues_after - queues_before)
    # The task queue, and the worker's mailbox: its name comes back at its next start.
    assert left == sorted([bed.queue, f"{name}_{socket_host()}-celery-pidbox"]), left


def test_a_worker_without_remote_control_says_so_once_at_start_up(bed: Bed) -> None:
    with worker(bed, "threads", 1, options={"visibility_timeout": LEASE}) as process:
        log = process.log

    assert log.count("Remote control is off on SQS: celery inspect, celery control") == 1, log
