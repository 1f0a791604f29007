"""Running a benchmark script as a user runs it, for the smoke tests that keep each working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


def run_benchmark(script: str, *args: str) -> str:
    """What ``python benchmarks/<script> <args>`` printed, run from the repository's root
    with this copy of the package importable (the workers a script starts import it too);
    it must exit 0. The timeout is a failure guard only: nothing here is timed."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout
