"""What a user sees in a worker's log at start-up: the mistakes that stop it, one line
each, and at INFO what the transport holds and what it hands back to SQS."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.integration.harness import REPO, Bed, log_has, settle, worker

LEASE = 3
#: A worker that stops at start-up does so in seconds; one that retries takes minutes.
STARTUP_TIMEOUT = 30


def failed_start(env: dict[str, str]) -> tuple[int, str]:
    """Start a worker as a user does, and return its exit status and everything it printed."""
    try:
        process = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.integration.app", "worker", "-P", "solo"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=STARTUP_TIMEOUT,
        )
    except subprocess.TimeoutExpired as still_running:
        printed = (still_running.stdout or b"") + (still_running.stderr or b"")
        raise AssertionError(
            f"the worker was still starting after {STARTUP_TIMEOUT} s:\n"
            f"{printed.decode(errors='replace')[-3000:]}"
        ) from None
    return process.returncode, process.stdout + process.stderr


def critical_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "CRITICAL/" in line]


def test_a_predefined_queue_that_does_not_exist_stops_the_worker_naming_it(bed: Bed) -> None:
    url = f"http://127.0.0.1:{bed.server.port}/123456789012/{bed.queue}"
    options = {"predefined_queues": {bed.queue: {"url": url}}}

    status, output = failed_start(bed.env(options=options, IT_RETRY_ON_STARTUP=1))

    assert status != 0, output
    (line,) = critical_lines(output)
    assert f"SQS queue {bed.queue} does not exist at {url} (its URL in predefined_queues)" in line
    assert "GetQueueAttributes answered NonExistentQueue" in line
    assert "Traceback" not in output, output


def test_no_credentials_stop_the_worker_saying_where_boto3_looked(bed: Bed, tmp_path: Path) -> None:
    empty = tmp_path / "empty-aws-file"
    empty.write_text("")
    env = {key: value for key, value in bed.env().items() if not key.startswith("AWS_")}
    env.update(
        IT_BROKER_URL=f"sqs://127.0.0.1:{bed.server.port}",
        IT_RETRY_ON_STARTUP="1",  # Celery's default: before, it retried 100 times
        AWS_SHARED_CREDENTIALS_FILE=str(empty),
        AWS_CONFIG_FILE=str(empty),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_DEFAULT_REGION="us-east-1",
    )

    status, output = failed_start(env)

    assert status != 0, output
    (line,) = critical_lines(output)
    assert "No AWS credentials found for SQS: none in the broker URL" in line
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in line
    assert f"nor in profile 'default' of {empty} and {empty}" in line
    assert "iam-role" in line
    assert "Unable to locate credentials" not in output, output
    assert "Traceback" not in output, output


def test_at_info_a_worker_says_once_what_it_holds_and_each_message_it_releases(
    bed: Bed,
) -> None:
    options = {
        "visibility_timeout": LEASE,
        "visiblity_timeout": 60,
        "release_on_failure": True,
        "release_delay": 60,
    }
    task_id = bed.send("fails", "rejected", "reject")
    with worker(bed, "threads", 1, options=options) as process:
        bed.wait_for_executions(1, timeout=30)
        released = settle(lambda: log_has(process, "Released to SQS", 1))
        log = process.log

    settings = re.findall(r"INFO/MainProcess\] SQS leases of .*", log)
    assert settings == [
        "INFO/MainProcess] SQS leases of 3 s (visibility_timeout), renewed when at most 1.5 s "
        "are left (adaptive margin), checked every 0.75 s, until the ack or 43140 s after the "
        "receive (SQS's 12 hours less a minute); a rejected message is released, visible again "
        "after 60 s (release_on_failure, release_delay); messages not started are released at "
        "shutdown; ETA tasks due in more than 900 s wait in SQS (eta_parking_threshold); "
        "countdowns published here are sent with an SQS delay of up to 900 s (eta_send_delay); "
        "large payloads off: every body in SQS (large_payload_bucket)"
    ], log
    assert log.count("Unknown transport option 'visiblity_timeout'") == 1, log
    assert released, log
    (release,) = re.findall(r"INFO/MainProcess\] Released to SQS on queue .*", log)
    assert f"on queue {bed.queue}: task tests.integration.app.fails[{task_id}]" in release
    assert "(failure, visible again in 60 s)" in release


def test_a_lease_not_renewed_is_warned_about_once_where_the_user_sees_it(bed: Bed) -> None:
    options = {"visibility_extension": False, "visibility_timeout": 60}
    with worker(bed, "threads", 1, options=options) as process:
        log = process.log

    assert log.count("WARNING/MainProcess] visibility_extension is False") == 1, log
    assert "INFO/MainProcess] SQS leases of 60 s (visibility_timeout), not renewed " in log, log
