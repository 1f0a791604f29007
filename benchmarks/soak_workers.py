"""The soak's ``celery worker`` processes: started, stopped warm or SIGKILLed, restarted, and
their memory read.

Each worker slot keeps its node name (``w1@host``) across restarts, as a Kubernetes pod's
replacement does, and each start is an incarnation of its own (``w1.2``), the name its
records carry. A worker runs in a session of its own: a SIGKILL goes to the whole group,
as when a container is killed, so that no prefork child lives on to finish a task.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


@dataclass
class Incarnation:
    """One start of a worker slot: its process, log, and memory samples."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    samples: list[tuple[float, int]] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        return "ready." in self.log.read_text(errors="replace")

    def connects(self) -> int:
        return connections_made(self.log)


class WorkerSlot:
    """Slot ``index`` of the fleet: the incarnation now running, and every earlier one."""

    def __init__(self, index: int, pool: str, concurrency: int, env: dict[str, str], logs: Path):
        self.index = index
        self.pool = pool
        self.concurrency = concurrency
        self.env = env
        self.logs = logs
        self.incarnations: list[Incarnation] = []

    @property
    def node(self) -> str:
        return f"w{self.index + 1}"

    @property
    def current(self) -> Incarnation | None:
        return self.incarnations[-1] if self.incarnations else None

    @property
    def up(self) -> bool:
        return self.current is not None and self.current.alive

    def start(self) -> Incarnation:
        name = f"{self.node}.{len(self.incarnations) + 1}"
        log = self.logs / f"worker-{name}.log"
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "soak_app",
            "worker",
            "-E",
            "-P",
            self.pool,
            "-c",
            str(self.concurrency),
            "-n",
            f"{self.node}@%h",
            "-l",
            "info",
            "--without-mingle",
            "--without-gossip",
        ]
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                cwd=BENCH_DIR,
                env={**self.env, "SOAK_WORKER": name},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        incarnation = Incarnation(name, process, log)
        self.incarnations.append(incarnation)
        return incarnation

    def sigterm(self) -> None:
        """Celery's warm shutdown, to the main process only, as Kubernetes sends it."""
        if self.up:
            assert self.current is not None
            self.current.process.send_signal(signal.SIGTERM)

    def sigkill(self) -> None:
        """The whole group, at once: a killed container leaves no process behind."""
        current = self.current
        if current is not None and current.alive:
            os.killpg(current.process.pid, signal.SIGKILL)
            current.process.wait()

    def drop_connection(self) -> None:
        if self.up:
            assert self.current is not None
            self.current.process.send_signal(signal.SIGUSR2)

    def sample_memory(self, now: float, parents: dict[int, int]) -> None:
        current = self.current
        if current is not None and current.alive:
            rss = tree_rss(current.process.pid, parents)
            if rss:
                current.samples.append((now, rss))

    def stop(self, grace: float) -> bool:
        """Warm shutdown; SIGKILL after ``grace`` s. Whether it stopped by itself."""
        current = self.current
        if current is None or not current.alive:
            return True
        current.process.send_signal(signal.SIGTERM)
        try:
            current.process.wait(grace)
            return True
        except subprocess.TimeoutExpired:
            self.sigkill()
            return False


def connections_made(log: Path) -> int:
    """How many times a worker's consumer has connected, by its log: Celery logs
    "Connected to" at each connect."""
    return log.read_text(errors="replace").count("Connected to")


def wait_ready(incarnation: Incarnation, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if incarnation.ready():
            return True
        if not incarnation.alive:
            return False
        time.sleep(0.2)
    return False


def tree_rss(pid: int, parents: dict[int, int]) -> int:
    """Resident bytes of ``pid`` and its children (a prefork pool), from /proc (Linux)."""
    return sum(_rss(p) for p in (pid, *(child for child, ppid in parents.items() if ppid == pid)))


def process_parents() -> dict[int, int]:
    """The parent of every process, read once for a round of samples."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The command name in parentheses may hold spaces; the fields after it do not.
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
