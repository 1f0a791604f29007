"""A long-running ``celery`` or Flower process for the scripts here, stopped with its children.

Each runs in a session of its own, so that stopping it reaches its pool's children too,
and writes its output to a log file the script reads while it runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

__all__ = ["Spawned"]


class Spawned:
    """A subprocess in a session of its own, its output in ``log``."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.log = log
        self._out = log.open("w")
        self.process = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, grace: float = 20.0) -> None:
        """``sig`` to its whole group, then SIGKILL to the group if it outlives ``grace``.

        The group is signalled only while its leader is not reaped, so its id is still ours.
        """
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self._out.close()
