"""Lease health as an operator sees it on a real worker: exporter, inspect commands, DEBUG log."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from celery_sqs_heartbeat.compat import KOMBU_BROADCASTS_THROUGH_SNS
from tests.integration.harness import REPO, Bed, needs_sns_fanout, wait_for, worker
from tests.integration.otel_metrics import data_points
from tests.ports import free_port

LEASE = 3

# Never through a configured proxy: everything here is on 127.0.0.1.
_local = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrape(port: int) -> dict[str, float]:
    """Every sample on the worker's metrics page, by name with its labels."""
    with _local.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        text = page.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def scrape_until(port: int, done: Any, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    samples: dict[str, float] = {}
    refused: Exception | None = None
    while time.monotonic() < deadline:
        try:
            samples = scrape(port)
        except (urllib.error.URLError, ConnectionError) as exc:
            refused = exc
        else:
            if done(samples):
                return samples
        time.sleep(0.5)
    if not samples:
        raise AssertionError(
            f"nothing serves http://127.0.0.1:{port}/metrics ({refused}); the transport must "
            "call celery_sqs_heartbeat.monitoring.prometheus.start_exporter when a worker starts "
            "consuming"
        )
    return samples


def test_the_exporter_shows_renewals_while_a_long_task_runs(bed: Bed) -> None:
    port = free_port()
    options = {"visibility_timeout": LEASE, "metrics_port": port, "metrics_address": "127.0.0.1"}
    bed.send("busy", "long", 3 * LEASE)
    # Prefork: the counters are the main process's, where the leases are renewed.
    with worker(bed, "prefork", 1, options=options):
        during = scrape_until(
            port,
            lambda s: s.get("celery_sqs_heartbeat_renewal_calls_total", 0) >= 2,
            timeout=30,
        )
        bed.wait_for_executions(1, timeout=30)
        after = scrape_until(
            port, lambda s: s["celery_sqs_heartbeat_leases_held"] == 0, timeout=LEASE + 2
        )

    assert during["celery_sqs_heartbeat_renewal_calls_total"] >= 2, during
    assert during["celery_sqs_heartbeat_renewal_entries_total"] >= 2
    assert during["celery_sqs_heartbeat_leases_held"] == 1
    assert during["celery_sqs_heartbeat_renewal_margin_seconds_count"] >= 2
    # Every renewal went out before its lease ran out.
    assert during["celery_sqs_heartbeat_renewal_margin_seconds_sum"] > 0
    assert during["celery_sqs_heartbeat_renewal_margin_seconds_bucket{le=+Inf}"] >= 2
    assert after["celery_sqs_heartbeat_leases_lost_total"] == 0
    assert after["celery_sqs_heartbeat_leases_held"] == 0


def latest(points: list[dict[str, Any]], name: str) -> float | None:
    """The last value exported of an instrument without attributes but the system's."""
    values = [p["value"] for p in points if p["name"] == name and len(p["attributes"]) == 1]
    return values[-1] if values else None


def test_opentelemetry_gets_the_renewals_from_the_main_process_alone(bed: Bed) -> None:
    """The application installs an SDK MeterProvider at import, before the fork. The pool
    process that runs the long task is forked once the worker consumes (its predecessor
    left after one task), so it inherits the instruments and its reader exports, but only
    the main process, which holds the leases, reports them."""
    exported = str(bed.logs / "metrics.jsonl")
    options = {"visibility_timeout": LEASE}
    bed.send("busy", "short", 0)
    bed.send("busy", "long", 3 * LEASE)
    with worker(
        bed, "prefork", 1, options=options, IT_METRICS_FILE=exported, IT_MAX_TASKS_PER_CHILD=1
    ) as process:
        during = wait_for(
            lambda: (latest(data_points(exported), "celery_sqs_heartbeat.renewal.calls") or 0)
            >= 2,
            timeout=30,
            what="two renewal calls exported",
        )
        bed.wait_for_executions(2, timeout=30)
        wait_for(
            lambda: latest(data_points(exported), "celery_sqs_heartbeat.leases.held") == 0,
            timeout=LEASE + 5,
            what="no lease held, exported",
        )
        main = process.process.pid
    points = data_points(exported)

    # Two pool processes ran the two tasks: the second was forked after the first task.
    assert during and len({run["pid"] for run in bed.executions()}) == 2
    assert {point["pid"] for point in points} == {main}
    assert all(point["attributes"]["messaging.system"] == "aws_sqs" for point in points)
    held = [p["value"] for p in points if p["name"] == "celery_sqs_heartbeat.leases.held"]
    assert max(held) >= 1
    assert latest(points, "celery_sqs_heartbeat.leases.lost") == 0
    margins = [
        p["value"]
        for p in points
        if p["name"] == "celery_sqs_heartbeat.renewal.margin.renewals"
        and p["attributes"]["celery_sqs_heartbeat.renewal.margin.le"] == "+Inf"
    ]
    assert margins[-1] >= 2


def inspect(bed: Bed, command: str, options: dict[str, Any], node: str) -> dict[str, Any]:
    """``celery -A tests.integration.app inspect COMMAND --json -d NODE``, as an operator runs it.

    Asked of one node, the command returns with its reply; asked of all, it listens for
    its whole ``--timeout``, and the calls of a test took longer than its task ran.
    """
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.app",
            "inspect",
            command,
            "--json",
            "--destination",
            node,
            "--timeout",
            "5",
        ],
        cwd=REPO,
        env=bed.env(options=options, IT_IMPORT_CONTROL=1),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 0, (
        f"{process.stdout}{process.stderr}\nOn SQS a worker answers only if the transport "
        "broadcasts through SNS (supports_fanout), routes pidbox replies and deletes no-ack "
        "messages without an event loop, and imports celery_sqs_heartbeat.monitoring.control."
    )
    replies: dict[str, Any] = json.loads(process.stdout.strip().splitlines()[-1])
    return replies


@needs_sns_fanout
def test_inspect_sqs_leases_lists_the_running_task_and_its_renewals(bed: Bed) -> None:
    # Remote control on SQS goes through kombu's SNS fanout.
    options = {"visibility_timeout": LEASE, "supports_fanout": True}
    task_id = bed.send("busy", "long", 5 * LEASE)
    asked = f"w1@{socket.gethostname()}"
    with worker(bed, "prefork", 1, options=options):
        deadline = time.monotonic() + 4 * LEASE
        while True:
            replies = inspect(bed, "sqs_leases", options, asked)
            [(node, leases)] = replies.items()
            ours = [lease for lease in leases if lease["task_id"] == task_id]
            if (ours and ours[0]["renewals"] >= 1) or time.monotonic() > deadline:
                break
        stats = inspect(bed, "sqs_lease_stats", options, asked)
        bed.wait_for_executions(1, timeout=30)

    assert node.startswith("w1@")
    assert len(ours) == 1, leases
    assert ours[0]["renewals"] >= 1
    assert ours[0]["task_name"] == "tests.integration.app.busy"
    assert ours[0]["queue"] == bed.queue
    assert ours[0]["age"] > 0
    assert 0 < ours[0]["expires_in"] <= LEASE
    [counters] = stats.values()
    assert counters["leases_held"] >= 1
    assert counters["renewal_calls"] >= 1
    assert counters["renewal_margin"]["count"] >= 1


@pytest.mark.skipif(
    KOMBU_BROADCASTS_THROUGH_SNS, reason="kombu 5.7 and later broadcast through SNS"
)
def test_without_sns_fanout_the_worker_says_remote_control_is_off_and_works(bed: Bed) -> None:
    options = {"visibility_timeout": LEASE, "supports_fanout": True}
    task_id = bed.send("busy", "short", 0.1)
    with worker(bed, "prefork", 1, options=options) as process:
        bed.wait_for_executions(1, timeout=30)
        log = process.log
    assert bed.runs_per_task() == {task_id: 1}
    assert "has no SNS fanout for SQS, which came in kombu 5.7" in log, log


def test_a_worker_at_debug_level_logs_the_lease_summary(bed: Bed) -> None:
    bed.send("busy", "long", 2 * LEASE)
    with worker(
        bed, "threads", 1, loglevel="debug", options={"visibility_timeout": LEASE}
    ) as process:
        bed.wait_for_executions(1, timeout=30)
        log = process.log

    summaries = re.findall(r"SQS lease summary: held=\d+ renewal_calls=\d+ .*", log)
    assert summaries, log[-5000:]
    # The first comes at once, the next a minute later: not during this short test.
    assert len(summaries) == 1, summaries


def test_a_bad_metrics_port_stops_the_worker_at_start_up(bed: Bed) -> None:
    process = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.app", "worker", "-P", "solo"],
        cwd=REPO,
        env=bed.env(options={"metrics_port": 70000}),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert process.returncode != 0
    assert "metrics_port=70000: must be a TCP port, 1 to 65535" in process.stdout + process.stderr
