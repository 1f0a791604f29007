"""The chaos soak's short mode, as CI runs it: a pool for a minute of chaos (two minutes
with the warm-up, drain, reaper and stop on a 2-core machine), every check passed.

The verdicts' logic has unit tests (test_soak_verdicts.py); this proves the whole chain
on real workers: that the driver did inject every kind of fault (a soak whose faults
never fired would pass on an undisturbed fleet), that the countdowns were parked, and that
the pool's row says pass.

Every pool on the same seed, each on a server of its own: the seed fixes the plan (which
fault, when, to which worker) and the tasks' order; when each lands against the workers'
work is the machine's, so a failure here is a failure of a check, to be read in the kept
logs (``--judge`` replays the verdicts), never a run to try again.

Every pool: each one's 30-minute run passes every check (docs/benchmarks.md, "Chaos
soak", seed 1).
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

POOLS = ["prefork", "threads", "gevent", "solo"]

#: The plan's seed, the same for every pool.
SEED = "280"

#: A failure guard for one pool's run: a minute of chaos, the warm-up and the drain.
RUN_GUARD = 900


@pytest.mark.integration
@pytest.mark.skipif(
    not KOMBU_BROADCASTS_THROUGH_SNS,
    reason="the soak's monitors and sqs-reap need kombu 5.7's SNS fanout",
)
@pytest.mark.parametrize("pool", POOLS)
def test_a_minute_of_chaos_passes_every_check(pool: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH_DIR / "chaos_soak.py"),
            "--pools",
            pool,
            "--minutes",
            "1",
            "--seed",
            SEED,
            "--workdir",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_GUARD,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    row = next(line for line in done.stdout.splitlines() if line.startswith(f"| {pool} |"))
    assert row.endswith("| pass |"), output
    acts = [json.loads(line) for line in (tmp_path / pool / "driver.jsonl").open()]
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
    assert again.stdout.startswith(f"{pool}: "), again.stdout
