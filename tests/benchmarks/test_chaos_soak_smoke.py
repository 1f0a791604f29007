"""The chaos soak's short mode, as CI runs it: one pool for a minute of chaos (100 to 150 s
with start-up, drain, reaper and stop on a 2-core machine), every check passed.

The verdicts' logic has unit tests (test_soak_verdicts.py); this proves the whole chain
on real workers: that the driver did inject every kind of fault (a soak whose faults
never fired would pass on an undisturbed fleet), that the countdowns were parked, and
that the pool's row says pass.

A gevent fleet, seed 280, so that the two defects the soak found in the other pools and
seeds do not fail CI while they are open (each is held by a strict xfail): a worker on an
event loop exits when SQS fails the delete of a broadcast
(``tests/integration/test_mailbox_delete_faults.py``; gevent deletes it blocking and lives
on), and a worker that connects while SQS answers 5xx exits
(``tests/integration/test_reconnect_in_outage.py``; seed 280 puts the minute's outage,
41 s in, where no worker stops, restarts, drops its connection or is sent a broadcast).
With both fixed, any pool and seed passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from celery_sqs_heartbeat.compat import KOMBU_BROADCASTS_THROUGH_SNS
from tests.benchmarks.bench_modules import BENCH_DIR, bench_module

REPO = BENCH_DIR.parent


@pytest.mark.integration
@pytest.mark.soak
@pytest.mark.skipif(
    not KOMBU_BROADCASTS_THROUGH_SNS,
    reason="the soak's monitors and sqs-reap need kombu 5.7's SNS fanout",
)
def test_a_minute_of_chaos_on_a_gevent_fleet_passes_every_check(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH_DIR / "chaos_soak.py"),
            "--pools",
            "gevent",
            "--minutes",
            "1",
            "--seed",
            "280",
            "--workdir",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    row = next(line for line in done.stdout.splitlines() if line.startswith("| gevent |"))
    assert row.endswith("| pass |"), output
    acts = [json.loads(line) for line in (tmp_path / "gevent" / "driver.jsonl").open()]
    injected = {act["kind"] for act in acts}
    assert set(bench_module("soak_report").FAULT_ACTS) <= injected, injected
    assert "parked 0;" not in done.stdout, output
    # What the run kept judges the same again.
    again = subprocess.run(
        [sys.executable, str(BENCH_DIR / "chaos_soak.py"), "--judge", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.startswith("gevent: "), again.stdout
