"""The README's demo command, end to end on a tiny data set: a real worker, the embedded
strict SQS server, Spark in local mode, and a lease shorter than the first step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("matplotlib")

pytestmark = [pytest.mark.spark, pytest.mark.integration]

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_every_step_exactly_once(tmp_path: Path) -> None:
    # Starting Spark alone takes longer than this lease, so the first step can only
    # finish once if its lease is renewed.
    command = [
        sys.executable,
        "-m",
        "examples.spark_pipeline.demo",
        "--rows",
        "2000",
        "--lease",
        "3",
        "--out",
        str(tmp_path),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("SPARK_MASTER", None)
    result = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "EXACTLY ONCE: yes - 3 steps, 3 executions, 3 SQS receives" in result.stdout, output
    assert "receives and renewals: SQS server log" in result.stdout
    assert "REDELIVERED" not in result.stdout and "DUPLICATE" not in result.stdout
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "report.txt").read_text().startswith("Pipeline on celery_sqs_heartbeat")
    assert (run_dir / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert "orders_raw" in result.stdout and "2,000 rows" in result.stdout
