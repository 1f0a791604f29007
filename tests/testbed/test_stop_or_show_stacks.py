"""A process that hangs at its stop fails the test with every thread's stack
(tests/integration/harness.py, ``stop_or_show_stacks``): a hang says where it hung."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.harness import stop_or_show_stacks

#: Ignores SIGTERM, says it is ready, and waits in a function the stack must name.
HANGS = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def waits_for_ever():
    print("ready", flush=True)
    while True:
        time.sleep(0.1)
waits_for_ever()
"""


def start(code: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
    while "ready" not in log.read_text():
        assert process.poll() is None, log.read_text()
        time.sleep(0.05)
    return process


def test_a_process_still_running_after_its_stop_fails_with_its_stacks(tmp_path: Path) -> None:
    log = tmp_path / "hangs.log"
    process = start(HANGS, log)

    with pytest.raises(AssertionError, match="still running 1 s after signal 15") as failed:
        stop_or_show_stacks(process, signal.SIGTERM, 1, log)

    assert "in waits_for_ever" in str(failed.value)
    assert process.returncode == -signal.SIGABRT


def test_a_process_that_exits_gives_its_status(tmp_path: Path) -> None:
    log = tmp_path / "exits.log"
    process = start('import time; print("ready", flush=True); time.sleep(60)', log)

    assert stop_or_show_stacks(process, signal.SIGTERM, 30, log) == -signal.SIGTERM
