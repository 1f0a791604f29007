"""Append-only JSONL records written by the worker and read back by the demo's report.

"Each step ran exactly once" has to be measured, not assumed. The tasks write one
line when an execution starts and one when it ends; the worker's main process writes
one line per message it receives, per lease event and per ack. Several processes append to
the same file at once, so every record goes out as a single ``write`` on a file
opened with ``O_APPEND``: the kernel then never interleaves two records.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: Environment variable naming the directory the worker records into. Unset (as on a
#: production worker) means nothing is recorded.
RECORD_DIR_ENV = "SPARK_PIPELINE_RECORD_DIR"

#: One line per task execution start and end, written by the pool process running it.
EXECUTIONS = "executions.jsonl"
#: One line per message received, per lease renewed, released or lost, and per
#: message acked, written by the worker's main process.
WORKER_EVENTS = "worker-events.jsonl"


def record_dir() -> Path | None:
    """The directory this worker records into, if the demo asked for records."""
    value = os.environ.get(RECORD_DIR_ENV)
    return Path(value) if value else None


def append(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line, atomically with respect to other writers."""
    line = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read(path: Path) -> list[dict[str, Any]]:
    """All complete records in ``path``; none if it does not exist yet.

    The demo reads while the worker writes, so a last line without its newline is
    a record still being written and is left for the next read.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
