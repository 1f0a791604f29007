"""One pool's soak: its own strict server, three workers, the producer and the driver for the
set time; then calm, the drain, the reaper, the warm stop, and what was left.

Every pool gets a server of its own, so that one pool's queues, leftovers and event log
never mix with another's.
"""

from __future__ import annotations

import collections
import json
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_workers import local_server_env
from celery import Celery
from soak_driver import WORKER_ACTIONS, Driver
from soak_evidence import chaos_of, runs_and_receipts
from soak_plan import ChaosSettings, plan_chaos, plan_tasks
from soak_producer import Producer, Shapes
from soak_remains import BUCKET, FIFO_QUEUE, PREFIX, QUEUE, Remains
from soak_report import Leftovers, PoolResult
from soak_verdicts import Tally, judge, memory_verdict, objects_kept
from soak_workers import BENCH_DIR, WorkerSlot, wait_ready

from celery_sqs_heartbeat.testing import StrictSQSServer

#: The fraction of the workers' calls that fail all along, as SQS's 5xx do now and then.
BACKGROUND_FAILURES = 0.03

#: Connections each worker loses before the chaos, its memory judged from after them: a
#: worker's first lost connections raise its memory by some 30 MiB, to a level it then
#: keeps through any number more (every pool, 20 to 60 drops, docs/benchmarks.md), which
#: a short run would take for a leak.
WARM_UP_RECONNECTS = 5
#: A failure guard for each warm-up reconnect.
RECONNECT_GUARD = 60.0


@dataclass(frozen=True)
class SoakSettings:
    """What the command line chose, shared by every pool."""

    minutes: float
    seed: int
    workdir: Path
    lease: int = 8
    rate: float = 1.0
    workers: int = 3
    concurrency: int = 2
    parking_threshold: float = 8.0
    #: The drain's failure guard: every task done and every queue empty within it.
    drain_guard: float = 240.0
    memory_warmup: float = 30.0
    memory_margin_mib: float = 20.0
    memory_margin_ratio: float = 0.15

    @property
    def receive_slack(self) -> float:
        """The longest a received message may wait for Celery to see it: a solo worker's
        running task (the longest shape), and a long poll."""
        return self.shapes().long_seconds + 1

    @property
    def chaos(self) -> ChaosSettings:
        return ChaosSettings(duration=self.minutes * 60, lease=self.lease, workers=self.workers)

    def transport_options(self) -> dict[str, Any]:
        """The workers' options (and the monitors' and the reaper's)."""
        return {
            "region": "us-east-1",
            "is_secure": False,
            "wait_time_seconds": 1,
            "queue_name_prefix": PREFIX,
            "visibility_timeout": self.lease,
            "release_on_failure": True,
            "release_delay": [1, 2, 4],
            "eta_parking_threshold": self.parking_threshold,
            "large_payload_bucket": BUCKET,
            "large_payload_threshold": 4096,
            "supports_fanout": True,
            "events_through_sns": True,
        }

    def shapes(self) -> Shapes:
        return Shapes(
            queue=QUEUE,
            fifo_queue=FIFO_QUEUE,
            long_seconds=1.5 * self.lease,
            countdown=2.5 * self.parking_threshold,
            payload_bytes=8000,
        )


def run_pool(pool: str, settings: SoakSettings) -> PoolResult:
    workdir = settings.workdir / pool
    workdir.mkdir(parents=True, exist_ok=True)
    with StrictSQSServer() as server:
        return PoolRun(pool, settings, server, workdir).run()


class PoolRun:
    def __init__(
        self, pool: str, settings: SoakSettings, server: StrictSQSServer, workdir: Path
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.server = server
        self.workdir = workdir
        self.records = workdir / "records.jsonl"
        self.env = self._env()
        self.remains = Remains(server)
        concurrency = 1 if pool == "solo" else settings.concurrency
        self.slots = [
            WorkerSlot(index, pool, concurrency, self.env, workdir)
            for index in range(settings.workers)
        ]
        self.driver = Driver(
            server, self.slots, self.env, workdir / "driver.jsonl", settings.chaos.grace
        )
        #: When each worker that went through the warm-up reconnects had done so, by name.
        self.warmed: dict[str, float] = {}

    def run(self) -> PoolResult:
        began = time.monotonic()
        self.remains.make_queues(self.settings.lease)
        try:
            producer, reaped, leftovers = self._soak()
        finally:
            for slot in self.slots:
                slot.sigkill()
            self.driver.close()
        self._write_published(producer)
        return PoolResult(
            self.pool,
            self.settings.minutes,
            time.monotonic() - began,
            self._tally(producer),
            self.driver.acts,
            self._memory(),
            leftovers,
            shapes=dict(collections.Counter(task.shape for task in producer.published)),
            parked=self._parked(),
            reaped=reaped,
            failed_publishes=sum(producer.failed_tries.values()),
            given_up=producer.given_up,
        )

    def _soak(self) -> tuple[Producer, int, Leftovers]:
        """The fleet started, the chaos, the drain, the reaper and the warm stop: the
        producer (what it published), what the reaper deleted, and what was left."""
        for slot in self.slots:
            if not wait_ready(slot.start(), 60):
                raise RuntimeError(f"{slot.node} did not start; see {self.workdir}")
        self._warm_up()
        producer = self._chaos()
        self._drain(producer)
        reaped = self._reap()
        self.driver.sample()
        for slot in self.slots:
            if not slot.stop(60):
                self.driver.log("stuck", worker=slot.current and slot.current.name)
        self.driver.log("stopped")
        leftovers = self.remains.leftovers(
            [slot.node for slot in self.slots], producer.failed_tries, self._objects_kept()
        )
        self._keep_evidence()
        return producer, reaped, leftovers

    def _keep_evidence(self) -> None:
        """The server's event log and the workers' memory samples, for whoever reads a
        failed run after its server is gone."""
        with (self.workdir / "sqs-events.jsonl").open("w") as out:
            for event in self.server.events():
                out.write(json.dumps(event) + "\n")
        with (self.workdir / "memory.jsonl").open("w") as out:
            for slot in self.slots:
                for incarnation in slot.incarnations:
                    out.write(
                        json.dumps({"worker": incarnation.name, "samples": incarnation.samples})
                        + "\n"
                    )

    def _write_published(self, producer: Producer) -> None:
        with (self.workdir / "published.jsonl").open("w") as out:
            for task in producer.published:
                out.write(json.dumps(vars(task)) + "\n")

    def _parked(self) -> int:
        """Countdowns a worker parked in SQS, from the workers' logs."""
        parked = set()
        for log in self.workdir.glob("worker-*.log"):
            parked |= set(_PARKED.findall(log.read_text(errors="replace")))
        return len(parked)

    def _objects_kept(self) -> dict[str, str]:
        """The tasks whose S3 object may stay, and why: their lease reported lost in the
        workers' logs, or their worker SIGKILLed before the object could go."""
        lost: set[str] = set()
        for log in self.workdir.glob("worker-*.log"):
            lost |= set(_LOST_LEASE.findall(log.read_text(errors="replace")))
        runs, _ = runs_and_receipts(self.records)
        chaos = chaos_of(self.driver.acts, self.settings.lease, 0.0, self.pool)
        return objects_kept(runs, chaos.kills, lost, self.settings.lease)

    def _warm_up(self) -> None:
        """Every worker loses its connection :data:`WARM_UP_RECONNECTS` times, one drop
        after the reconnect of the one before, before any task is published."""
        fleet = [incarnation for slot in self.slots if (incarnation := slot.current)]
        for _ in range(WARM_UP_RECONNECTS):
            before = {incarnation.name: incarnation.connects() for incarnation in fleet}
            for slot in self.slots:
                slot.drop_connection()
            deadline = time.monotonic() + RECONNECT_GUARD
            while any(i.connects() <= before[i.name] for i in fleet):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"a warm-up reconnect did not come; see {self.workdir}")
                time.sleep(0.2)
        self.driver.sample()
        now = time.time()
        self.warmed = {incarnation.name: now for incarnation in fleet}
        self.driver.log("warmed", reconnects=WARM_UP_RECONNECTS)

    def _chaos(self) -> Producer:
        settings = self.settings
        rng = random.Random(f"{settings.seed}-{self.pool}")
        plan = plan_chaos(settings.chaos, rng)
        tasks = plan_tasks(settings.chaos.duration - settings.chaos.quiet_tail, settings.rate, rng)
        (self.workdir / "plan.json").write_text(
            json.dumps({"chaos": [vars(d) for d in plan], "tasks": [vars(t) for t in tasks]})
        )
        self.server.fail_fraction(
            BACKGROUND_FAILURES, "server_error", WORKER_ACTIONS, seed=settings.seed
        )
        self.driver.log("background", probability=BACKGROUND_FAILURES)
        started = time.monotonic()
        producer = Producer(self._producer_app(), settings.shapes(), tasks, started)
        producer.start()
        self.driver.run(plan, started, started + settings.chaos.duration)
        return producer

    def _drain(self, producer: Producer) -> None:
        """No more faults: wait for the producer, every task's run and empty queues, then
        for any copy received before the queues emptied to finish."""
        self.driver.calm()
        producer.join()
        deadline = time.monotonic() + self.settings.drain_guard
        while time.monotonic() < deadline and not self._drained(producer):
            self.driver.keep_up(time.monotonic() + 2)
        last_receive = max(
            (e["t"] for e in self.server.events() if e["action"] == "receive"), default=0.0
        )
        copies_done = last_receive + self.settings.shapes().long_seconds + 5
        self.driver.keep_up(time.monotonic() + max(0.0, copies_done - time.time()))
        self.driver.log("drained", complete=self._drained(producer))

    def _drained(self, producer: Producer) -> bool:
        runs, _ = runs_and_receipts(self.records)
        done = {run.task_id for run in runs if run.outcome == "ok"}
        if any(task.task_id not in done for task in producer.published):
            return False
        return self.remains.messages_left() == 0

    def _reap(self) -> int:
        """``celery sqs-reap --delete`` while the workers run (a live worker answers its
        pings; the killed monitors' queues hold unread events): what it removed."""
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "soak_app",
                "sqs-reap",
                "--delete",
                "--older-than",
                "0s",
                "--stale",
                "8s",
                "--ping-timeout",
                "2",
                "--show-kept",
            ],
            cwd=BENCH_DIR,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        (self.workdir / "reaper.txt").write_text(done.stdout + done.stderr)
        deleted = [line for line in done.stdout.splitlines() if line.startswith("deleted")]
        self.driver.log("reaped", code=done.returncode, deleted=len(deleted))
        return len(deleted)

    def _tally(self, producer: Producer) -> Tally:
        runs, receipts = runs_and_receipts(self.records)
        return judge(
            producer.published,
            runs,
            receipts,
            chaos_of(
                self.driver.acts, self.settings.lease, self.settings.receive_slack, self.pool
            ),
        )

    def _memory(self) -> list[Any]:
        """Each worker that lived through the run, from its warm-up to its warm stop: after
        its warm-up reconnects and ``memory_warmup`` s (its first tasks of each shape). A
        worker restarted in the chaos lives too short a life to tell a leak from its
        warm-up, and is not judged."""
        settings = self.settings
        verdicts = []
        for slot in self.slots:
            current = slot.current
            if current is None or current.name not in self.warmed or not current.samples:
                continue
            verdict = memory_verdict(
                current.name,
                current.samples,
                max(self.warmed[current.name], current.samples[0][0] + settings.memory_warmup),
                int(settings.memory_margin_mib * 1024 * 1024),
                settings.memory_margin_ratio,
            )
            if verdict is not None:
                verdicts.append(verdict)
        return verdicts

    def _producer_app(self) -> Celery:
        """Publishes through the heartbeat transport; countdowns go out undelayed, so that
        a worker receives and parks them (``eta_send_delay`` off)."""
        app = Celery("soak-producer", set_as_current=False)
        options = {**self.settings.transport_options(), "eta_send_delay": False}
        app.conf.update(
            broker_url=self.server.broker_url,
            broker_transport="celery_sqs_heartbeat:Transport",
            broker_transport_options=options,
            broker_connection_retry_on_startup=False,
        )
        return app

    def _longest_run(self) -> float:
        """Seconds a pool's run can last: the chaos, the drain's guard, and as long again
        for the start, the reaper and the stop."""
        return 2 * (self.settings.chaos.duration + self.settings.drain_guard)

    def _env(self) -> dict[str, str]:
        return local_server_env(
            SOAK_BROKER_URL=self.server.broker_url,
            SOAK_TRANSPORT_OPTIONS=json.dumps(self.settings.transport_options()),
            SOAK_QUEUES=f"{QUEUE},{FIFO_QUEUE}",
            SOAK_RECORDS=str(self.records),
            SOAK_EVENT_QUEUE_TTL=str(self._longest_run()),
        )


_PARKED = re.compile(r"Parking task \S+\[([0-9a-f-]+)\] in SQS")
_LOST_LEASE = re.compile(r"Lost the SQS lease of task \S+\[([0-9a-f-]+)\]")
