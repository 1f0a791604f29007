"""Keeps ``benchmarks/worker_throughput.py`` working: the benchmark is only run by hand, so
without this a change to the transport or the test server could break it unnoticed.

Nothing here is timed: the smoke run's figures depend on the machine.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import boto3
import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer
from tests.benchmarks.scripts import BENCHMARKS, run_benchmark


def _runner_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The benchmarks are scripts, not a package: their modules import each other from
    their own folder, as they do when the script runs."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_workers")


def _smoke_report(tmp_path: Path, *scenario: str) -> tuple[str, str]:
    """Run the script at smoke size; its markdown report and what it printed."""
    report = tmp_path / "report.md"
    printed = run_benchmark(
        "worker_throughput.py",
        *scenario,
        "--smoke",
        "--markdown",
        str(report),
        "--workdir",
        str(tmp_path / "work"),
    )
    return report.read_text(), printed


@pytest.mark.integration
@pytest.mark.parametrize("scenario", [(), ("--scenario", "receive")], ids=["acks", "receive"])
def test_smoke_run_compares_both_transports(tmp_path: Path, scenario: tuple[str, ...]) -> None:
    table, printed = _smoke_report(tmp_path, *scenario)
    assert table.strip() in printed
    for transport in ("stock", "ours"):
        row = re.search(rf"^\| 0 ms \| threads -c 8 \| {transport} \| 1 \| (\S+) ", table, re.M)
        assert row, f"no row for {transport} in:\n{table}"
        float(row.group(1))  # tasks/s, i.e. every message was deleted
        if scenario:
            idle = re.search(rf"^\| 0 ms \| threads -c 8 \| {transport} \| (\S+) \|", table, re.M)
            assert idle, f"no idle row for {transport} in:\n{table}"
            float(idle.group(1))  # ReceiveMessage calls per minute while idle
    assert "**NO**" not in table and "VIOLATIONS" not in table


def test_batched_deletes_count_as_deletes(
    sqs_server: StrictSQSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run ends at the last message's delete, however the transport sends deletes."""
    bench = _runner_module(monkeypatch)
    sqs = boto3.client("sqs", **sqs_server.boto3_kwargs)
    queue = "bench-batched-deletes"
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    for n in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=str(n))
    sqs_server.clear_events()
    sqs_server.reset_calls()
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert len(received) == 3
    sqs.delete_message(QueueUrl=url, ReceiptHandle=received[0]["ReceiptHandle"])
    sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(received[1:])
        ],
    )

    deleted, first_receive, last_delete = bench.deletion_progress(sqs_server.events(), queue)
    calls, entries = sqs_server.calls(), sqs_server.batch_entries()

    assert deleted == 3
    assert 0 < first_receive <= last_delete
    assert bench.deletes_arrived(calls, entries) == 3
