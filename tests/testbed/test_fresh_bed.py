"""Each integration test's bed starts on a server without the faults of the tests before
it (tests/integration/harness.py, ``fresh_bed``): a counted fault one test left unused
(three slow deletes where its workers made two calls) failed the next test's check that
every fault it set was used."""

from __future__ import annotations

from pathlib import Path

from celery_sqs_heartbeat.testing import StrictSQSServer
from tests.integration.harness import fresh_bed


def test_a_fault_the_test_before_left_unused_is_gone(
    sqs_server: StrictSQSServer, tmp_path: Path
) -> None:
    sqs_server.inject_fault("DeleteMessageBatch", "delay", count=3, seconds=4)
    sqs_server.outage(300, "server_error", ["SendMessageBatch"])
    assert len(sqs_server.pending_faults()) == 2

    bed = fresh_bed(sqs_server, tmp_path)

    assert bed.server.pending_faults() == []
