"""The soak's driver: carries out the seeded schedule on the workers and the strict server,
restarts what it stopped, and logs every act with the wall-clock time the tasks' records
use, so that the verdicts can read a second run against it.

Each act is logged as a JSON line: ``{"t": ..., "kind": ..., ...}``; ``sigkill`` names
the incarnation killed, ``outage`` its length. Nothing here judges.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from soak_plan import Disruption
from soak_workers import BENCH_DIR, WorkerSlot, process_parents

from celery_sqs_heartbeat.testing import StrictSQSServer

#: The calls of a worker's lease and receive path: the windows of throttling and 5xx fail
#: these; an outage fails every SQS call, the producer's too.
WORKER_ACTIONS = (
    "ReceiveMessage",
    "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
    "DeleteMessage",
    "DeleteMessageBatch",
)
#: How often the workers' memory is read.
SAMPLE_EVERY = 2.0


class Driver:
    """Acts on ``slots`` and ``server`` as the schedule says, from ``started`` (monotonic)."""

    def __init__(
        self,
        server: StrictSQSServer,
        slots: Sequence[WorkerSlot],
        env: dict[str, str],
        log: Path,
        grace: float,
    ) -> None:
        self.server = server
        self.slots = slots
        self.env = env
        self.logs = log.parent
        self.grace = grace
        self.acts: list[dict[str, Any]] = []
        self._log = log.open("a")
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        #: Slots sent SIGTERM, when; how long each waits after it exits; when each restarts.
        self._stopping: dict[int, float] = {}
        self._restart_wait: dict[int, float] = {}
        self._restart_at: dict[int, float] = {}
        self._monitors: list[subprocess.Popen[bytes]] = []
        self._next_sample = 0.0

    def log(self, kind: str, **details: Any) -> None:
        act = {"t": time.time(), "kind": kind, **details}
        self.acts.append(act)
        self._log.write(json.dumps(act) + "\n")
        self._log.flush()

    def run(self, plan: Sequence[Disruption], started: float, until: float) -> None:
        """Carry out ``plan`` and keep the fleet up until ``until`` (monotonic)."""
        for disruption in plan:
            self._at(started + disruption.at, self._act(disruption))
        self.keep_up(until)

    def keep_up(self, until: float) -> None:
        """Do what is due, restart what is down, sample memory, until ``until``."""
        while time.monotonic() < until:
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                heapq.heappop(self._due)[2]()
            self._supervise(now)
            if now >= self._next_sample:
                self.sample()
                self._next_sample = now + SAMPLE_EVERY
            time.sleep(0.1)

    def sample(self) -> None:
        parents, now = process_parents(), time.time()
        for slot in self.slots:
            slot.sample_memory(now, parents)

    def calm(self) -> None:
        """The chaos is over: no fault left on the server, nothing planned still to do, and
        every monitor killed (a live one's queue would be kept by the reaper)."""
        self._due.clear()
        self.server.clear_faults()
        for index, monitor in enumerate(self._monitors, 1):
            if monitor.poll() is None:
                self.log("monitor_kill", monitor=index)
                _kill_group(monitor)
        self.log("calm")

    def close(self) -> None:
        for monitor in self._monitors:
            _kill_group(monitor)
        self._log.close()

    def _at(self, when: float, act: Callable[[], None]) -> None:
        heapq.heappush(self._due, (when, next(self._order), act))

    def _act(self, disruption: Disruption) -> Callable[[], None]:
        def act() -> None:
            getattr(self, f"_{disruption.kind}")(disruption)

        return act

    def _supervise(self, now: float) -> None:
        """SIGKILL a warm shutdown that outlived the grace period, as Kubernetes does; note
        a stop that ended (or a worker that died by itself) and restart it when due."""
        for slot in self.slots:
            if slot.up:
                asked = self._stopping.get(slot.index)
                if asked is not None and now - asked > self.grace:
                    self.log("sigkill", worker=_name(slot), after="grace")
                    slot.sigkill()
                continue
            restart_at = self._restart_at.get(slot.index)
            if restart_at is not None:
                if now >= restart_at:
                    del self._restart_at[slot.index]
                    self.log("restart", worker=slot.start().name)
                continue
            code = slot.current.process.returncode if slot.current else None
            if self._stopping.pop(slot.index, None) is not None:
                self.log("exited", worker=_name(slot), code=code)
                wait = self._restart_wait.pop(slot.index)
            else:
                self.log("crashed", worker=_name(slot), code=code)
                wait = 1.0
            self._restart_at[slot.index] = now + wait

    def _sigterm(self, disruption: Disruption) -> None:
        slot = self._slot_up(disruption, "sigterm")
        if slot is not None:
            self.log("sigterm", worker=_name(slot))
            slot.sigterm()
            self._stopping[slot.index] = time.monotonic()
            self._restart_wait[slot.index] = disruption.seconds

    def _sigkill(self, disruption: Disruption) -> None:
        slot = self._slot_up(disruption, "sigkill")
        if slot is not None:
            self.log("sigkill", worker=_name(slot))
            slot.sigkill()
            self._restart_at[slot.index] = time.monotonic() + disruption.seconds

    def _slot_up(self, disruption: Disruption, kind: str) -> WorkerSlot | None:
        """The slot to act on, if it is up and not already stopping (else logged skipped)."""
        slot = self.slots[disruption.worker or 0]
        if slot.up and slot.index not in self._stopping:
            return slot
        self.log("skipped", planned=kind, slot=slot.node)
        return None

    def _drop_connection(self, disruption: Disruption) -> None:
        """SIGUSR2, once the worker is ready: before, its handler is not installed and the
        signal's default action ends the worker (exit status -12)."""
        slot = self._slot_up(disruption, "drop_connection")
        if slot is not None and not (slot.current and slot.current.ready()):
            self.log("skipped", planned="drop_connection", slot=slot.node)
        elif slot is not None:
            self.log("drop_connection", worker=_name(slot))
            slot.drop_connection()

    def _throttle(self, disruption: Disruption) -> None:
        self.log("throttle", seconds=disruption.seconds)
        self.server.outage(disruption.seconds, "throttle", WORKER_ACTIONS)

    def _server_errors(self, disruption: Disruption) -> None:
        self.log("server_errors", seconds=disruption.seconds)
        self.server.outage(disruption.seconds, "server_error", WORKER_ACTIONS)

    def _slow_deletes(self, disruption: Disruption) -> None:
        self.log("slow_deletes", seconds=disruption.seconds, count=disruption.count)
        self.server.inject_fault(
            "DeleteMessageBatch", "delay", disruption.count, disruption.seconds
        )

    def _failing_deletes(self, disruption: Disruption) -> None:
        self.log("failing_deletes", count=disruption.count)
        self.server.inject_fault("DeleteMessageBatch", "server_error", disruption.count)
        self.server.fail_entries("DeleteMessageBatch", "InternalError", disruption.count)

    def _outage(self, disruption: Disruption) -> None:
        self.log("outage", seconds=disruption.seconds)
        self.server.outage(disruption.seconds, "server_error")

    def _monitor(self, disruption: Disruption) -> None:
        """``celery events --dump`` started, and SIGKILLed ``seconds`` later: what it leaves
        (its event queue, subscribed) is the reaper's to remove."""
        index = len(self._monitors) + 1
        with (self.logs / f"monitor-{index}.log").open("wb") as out:
            monitor = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "soak_app", "events", "--dump"],
                cwd=BENCH_DIR,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._monitors.append(monitor)
        self.log("monitor_start", monitor=index)

        def kill() -> None:
            self.log("monitor_kill", monitor=index)
            _kill_group(monitor)

        self._at(time.monotonic() + disruption.seconds, kill)


def _name(slot: WorkerSlot) -> str | None:
    return slot.current.name if slot.current else None


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
