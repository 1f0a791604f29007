"""The README's demo command, end to end on a tiny data set: real workers, a strict SQS
server, Spark in local mode, and a lease shorter than the first step."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import boto3
import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer

pytest.importorskip("pyspark")
pytest.importorskip("matplotlib")

from examples.spark_pipeline import records
from examples.spark_pipeline.demo import parse_args

pytestmark = [pytest.mark.spark, pytest.mark.integration]

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Starting Spark alone takes longer than this lease, so the first step can only
#: finish once if its lease is renewed.
TINY_RUN = ["--rows", "2000", "--lease", "3"]


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("AWS_") and name != "SPARK_MASTER"
    }
    # No credentials but the ones the command line gives: no shared files, no profile.
    environment.update(
        PYTHONPATH=str(REPO_ROOT),
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_CONFIG_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    return subprocess.run(
        [sys.executable, "-m", "examples.spark_pipeline.demo", *TINY_RUN, *args],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_demo_runs_every_step_exactly_once(tmp_path: Path) -> None:
    result = run_demo("--out", str(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "EXACTLY ONCE: yes - 3 steps, 3 executions, 3 SQS receives" in result.stdout, output
    assert "receives and renewals: SQS server log" in result.stdout
    assert "REDELIVERED" not in result.stdout and "DUPLICATE" not in result.stdout
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "report.txt").read_text().startswith("Pipeline on celery_sqs_heartbeat")
    assert (run_dir / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert "orders_raw" in result.stdout and "2,000 rows" in result.stdout


def test_demo_on_an_endpoint_it_did_not_start_with_two_workers(
    tmp_path: Path, sqs_server: StrictSQSServer
) -> None:
    """The path a real SQS region or endpoint takes: credentials from the flags, no server
    log to read, two workers on one queue as on two machines. The server, which this test
    owns, confirms what the demo could only learn from the workers."""
    result = run_demo(
        "--endpoint-url",
        sqs_server.endpoint_url,
        "--region",
        sqs_server.REGION,
        "--aws-access-key-id",
        sqs_server.ACCESS_KEY,
        "--aws-secret-access-key",
        sqs_server.ACCESS_KEY,
        "--workers",
        "2",
        "--concurrency",
        "1",
        "--out",
        str(tmp_path),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"SQS: SQS endpoint {sqs_server.endpoint_url}" in result.stdout
    assert "2 workers with 'celery_sqs_heartbeat:Transport'" in result.stdout
    assert "EXACTLY ONCE: yes - 3 steps, 3 executions, 3 SQS receives" in result.stdout, output
    assert "receives and renewals: worker records" in result.stdout
    receives = Counter(
        event["message_id"]
        for event in sqs_server.events()
        if event["action"] == "receive"
        and event["result"] == "ok"
        and "spark-pipeline-" in str(event["queue"])
    )
    assert len(receives) == 3 and set(receives.values()) == {1}, receives
    (run_dir,) = tmp_path.iterdir()
    worker_events = records.read(run_dir / "heartbeat" / "records" / records.WORKER_EVENTS)
    ready = [record["worker"] for record in worker_events if record["event"] == "worker_ready"]
    assert sorted(name.split("@")[0] for name in ready) == ["heartbeat-1", "heartbeat-2"]
    # The workers' acks stand in for the server's deletes on the timeline.
    acked = Counter(record["message_id"] for record in worker_events if record["event"] == "ack")
    assert acked == receives
    queues = boto3.client("sqs", **sqs_server.boto3_kwargs).list_queues().get("QueueUrls", [])
    assert not [url for url in queues if "spark-pipeline-" in url], "queues left behind"


@pytest.mark.parametrize("flag", ["--workers", "--concurrency", "--rows"])
def test_a_count_below_one_stops_the_demo_with_the_rule(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse_args([flag, "0"])
    assert stopped.value.code == 2
    assert "--rows, --concurrency and --workers must be positive" in capsys.readouterr().err
