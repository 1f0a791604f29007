"""Starting and stopping the strict SQS server's subprocess.

A subprocess, because the server patches moto for the whole process it runs in: the
tests' own process may use plain moto (``mock_aws``), which must stay as it is.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from .endpoint import ENTRY_MODULE, HOST, READY_PREFIX


class ServerProcess:
    """The server's subprocess, from its start until it announces its port, and its stop."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None

    def start(self, max_hold_seconds: float, deadline: float) -> int:
        """The port the server bound, once it announces it (by ``deadline``, monotonic)."""
        command = [
            sys.executable,
            "-m",
            ENTRY_MODULE,
            "--host",
            HOST,
            "--port",
            "0",
            "--max-hold-seconds",
            repr(max_hold_seconds),
            "--stop-at-stdin-eof",
        ]
        # Let the child import this very copy of the package, installed or not.
        source_root = str(Path(__file__).resolve().parents[2])
        python_path = os.pathsep.join(filter(None, [source_root, os.environ.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": python_path},
        )
        lines: queue.Queue[str] = queue.Queue()
        assert self._proc.stdout is not None  # stdout=PIPE
        threading.Thread(target=_pump_lines, args=(self._proc.stdout, lines), daemon=True).start()
        return self._wait_ready(lines, deadline)

    def _wait_ready(self, lines: queue.Queue[str], deadline: float) -> int:
        assert self._proc is not None
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"strict SQS server exited with {self._proc.returncode} before it "
                        "was ready; see its stderr"
                    ) from None
                continue
            if line.startswith(READY_PREFIX):
                return int(line.strip().rsplit(":", 1)[1])
        raise TimeoutError("strict SQS server did not announce its port in time")

    def stop(self) -> None:
        """Terminate the server, killing it if it does not exit within 5 s."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def _pump_lines(stream: IO[str], lines: queue.Queue[str]) -> None:
    """Forward the server's stdout, and keep draining it so the server never blocks."""
    for line in stream:
        lines.put(line)
