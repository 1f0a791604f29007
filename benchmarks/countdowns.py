"""Countdown tasks on one worker: held in its memory, or delayed in SQS (issue 35).

``--tasks`` tasks (10,000) with countdowns spread uniformly over ``--low`` to ``--high``
seconds (60 to 900) are published by a producer to one ``celery worker`` (prefork
``-c 4``, kombu's and Celery's defaults otherwise: 10 s long polls, prefetch multiplier
4, late acks as every benchmark here). Three sides run at the same time, each with its
own strict SQS server, so that its requests are counted apart, and its own producer,
on the side's transport:

* ``stock``: kombu's SQS transport. The queue is created by kombu, with its default
  visibility timeout of 30 minutes, longer than any countdown: nothing renews, and no
  task is handed out twice.
* ``main``: this package with ``eta_send_delay: False``, which is what ``main`` did
  before issue 35: the worker receives each task at once and holds it until due,
  renewing its 30 s lease.
* ``delay``: this package as it is (``eta_send_delay`` on): each task is sent with
  ``DelaySeconds`` (whole seconds to its ETA), and SQS hands it out when it is due.

Per side: the worker's resident memory (``VmRSS`` of the main process and of its main
process plus pool, sampled every 2 s: the peak, and at the end, once every task ran),
the SQS requests by kind from the first publish to the last task's delete (the
producer's SendMessage among them), renewal entries, how late each task started after
its ETA (from the task's own record: p50, p99, max), and the tasks run (each must run
once), with the leases the worker reported lost.

    python benchmarks/countdowns.py              # 10,000 tasks over 60-900 s (~17 min)
    python benchmarks/countdowns.py --quick      # 300 tasks over 60-120 s
    python benchmarks/countdowns.py --smoke      # 20 tasks over 3-8 s: keeps it working
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from bench_report import environment
from bench_runs import TRANSPORTS, Setup, Side
from bench_workers import _worker, worker_env
from celery import Celery

from celery_sqs_heartbeat.testing import StrictSQSServer

SIDES = (
    Side("stock", TRANSPORTS["stock"]),
    Side("main", TRANSPORTS["ours"], {"eta_send_delay": False}),
    Side("delay", TRANSPORTS["ours"]),
)
SETUP = Setup("prefork -c 4", "prefork", 4)
#: kombu's options every side gets; the rest are kombu's and this package's defaults.
OPTIONS = {"region": "us-east-1", "is_secure": False}
#: How often the worker's memory is read.
SAMPLE_EVERY = 2.0
#: After the last task is due: how long its run may take to show (a failure guard).
GRACE = 180.0
#: After every task ran once: how long a second run of any would have to show.
DUPLICATE_GUARD = 20.0
RENEWALS = ("ChangeMessageVisibilityBatch", "ChangeMessageVisibility")
SHOWN = ("SendMessage", "ReceiveMessage", *RENEWALS, "DeleteMessageBatch", "DeleteMessage")


@dataclass
class Result:
    side: str
    published: int = 0
    publish_seconds: float = 0.0
    #: Sent with a DelaySeconds, as the server saw the SendMessage calls.
    delayed: int = 0
    rss_peak_main: int = 0
    rss_peak_total: int = 0
    rss_end_total: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)
    #: Seconds from each task's ETA to its start.
    lateness: list[float] = field(default_factory=list)
    runs: int = 0
    distinct: int = 0
    duplicates: int = 0
    missing: int = 0
    lost_leases: int = 0
    errors: int = 0

    @property
    def renewal_entries(self) -> int:
        batched = self.entries.get("ChangeMessageVisibilityBatch", 0)
        return batched + self.calls.get("ChangeMessageVisibility", 0)


class MemorySampler(threading.Thread):
    """``VmRSS`` of a process and its children, every ``SAMPLE_EVERY`` s, in kB."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_main = 0
        self.peak_total = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(SAMPLE_EVERY):
            main, total = self.read()
            self.peak_main = max(self.peak_main, main)
            self.peak_total = max(self.peak_total, total)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def read(self) -> tuple[int, int]:
        main = _vm_rss(self.pid)
        return main, main + sum(_vm_rss(child) for child in _children(self.pid))


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The fields after the command (which may hold spaces): state, then the parent.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _vm_rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def countdowns(tasks: int, low: float, high: float, seed: int) -> list[float]:
    """The same countdowns for every side, in the order they are published."""
    rng = random.Random(seed)
    return [rng.uniform(low, high) for _ in range(tasks)]


def publish(server: StrictSQSServer, side: Side, queue: str, waits: Sequence[float]) -> dict:
    """Each task as ``apply_async(countdown=...)`` sends it; its id and ETA (epoch)."""
    app = Celery(f"countdowns-{side.label}", set_as_current=False)
    app.conf.update(
        broker_url=server.broker_url,
        broker_transport=side.transport,
        broker_transport_options={**OPTIONS, **side.options},
    )
    etas: dict[str, float] = {}
    try:
        with app.producer_or_acquire() as producer:
            for wait in waits:
                # The ETA Celery writes for a countdown, read back exactly.
                eta = datetime.now(timezone.utc) + timedelta(seconds=wait)
                sent = app.send_task("bench_app.noop", queue=queue, eta=eta, producer=producer)
                etas[sent.id] = eta.timestamp()
    finally:
        app.close()
    return etas


def run_side(side: Side, waits: Sequence[float], workdir: Path) -> Result:
    """One side's whole run: server, worker, publish, wait for every task, counts."""
    result = Result(side.label)
    queue = f"countdowns-{side.label}"
    records = workdir / f"{queue}.jsonl"
    log = workdir / f"{queue}.log"
    options = {**OPTIONS, **side.options}
    with (
        StrictSQSServer() as server,
        _worker(
            worker_env(server.broker_url, side.transport, options, queue, records), SETUP, log
        ) as w,
    ):
        w.wait_ready(120)
        sampler = MemorySampler(w.process.pid)
        sampler.start()
        server.reset_calls()
        started = time.monotonic()
        etas = publish(server, side, queue, waits)
        result.published, result.publish_seconds = len(etas), time.monotonic() - started
        _wait_for_runs(records, len(etas), max(etas.values()) + GRACE)
        result.rss_end_total = sampler.read()[1]
        time.sleep(DUPLICATE_GUARD)
        sampler.stop()
        result.calls, result.entries = server.calls(), server.batch_entries()
        result.delayed = sum(
            1 for call in server.call_log() for delay in call["delays"] or [] if delay > 0
        )
        result.rss_peak_main, result.rss_peak_total = sampler.peak_main, sampler.peak_total
        w.stop()
    _tally_runs(result, records, etas)
    text = log.read_text(errors="replace")
    result.lost_leases = text.count("Lost the SQS lease")
    result.errors = len(re.findall(r"/ERROR|/CRITICAL|Traceback", text))
    return result


def _wait_for_runs(records: Path, count: int, until_epoch: float) -> None:
    while time.time() < until_epoch:
        if records.exists() and len(records.read_text().splitlines()) >= count:
            return
        time.sleep(1)


def _tally_runs(result: Result, records: Path, etas: dict[str, float]) -> None:
    lines = [json.loads(line) for line in records.read_text().splitlines() if line]
    per_task = collections.Counter(record["task_id"] for record in lines)
    first_start: dict[str, float] = {}
    for record in lines:
        first_start[record["task_id"]] = min(
            record["start"], first_start.get(record["task_id"], 1e18)
        )
    result.runs = len(lines)
    result.distinct = len(per_task)
    result.duplicates = sum(n - 1 for n in per_task.values() if n > 1)
    result.missing = sum(1 for task_id in etas if task_id not in per_task)
    result.lateness = [first_start[t] - eta for t, eta in etas.items() if t in first_start]


def _quantile(values: Sequence[float], q: float) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}"


def table(results: Sequence[Result]) -> str:
    mb = 1024
    lines = [
        "| | " + " | ".join(f"`{r.side}`" for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]

    def row(name: str, values: Sequence[Any]) -> None:
        lines.append(f"| {name} | " + " | ".join(str(v) for v in values) + " |")

    row(
        "tasks published (s to publish)",
        [f"{r.published:,} ({r.publish_seconds:.0f} s)" for r in results],
    )
    row("sent with DelaySeconds", [f"{r.delayed:,}" for r in results])
    row("worker RSS peak, main process (MB)", [f"{r.rss_peak_main / mb:.1f}" for r in results])
    row("worker RSS peak, main + pool (MB)", [f"{r.rss_peak_total / mb:.1f}" for r in results])
    row("worker RSS at the end, main + pool (MB)", [f"{r.rss_end_total / mb:.1f}" for r in results])
    for action in SHOWN:
        row(f"{action} calls", [f"{r.calls.get(action, 0):,}" for r in results])
    row(
        "other calls",
        [f"{sum(n for a, n in r.calls.items() if a not in SHOWN):,}" for r in results],
    )
    row("all SQS requests", [f"{sum(r.calls.values()):,}" for r in results])
    row("renewal entries", [f"{r.renewal_entries:,}" for r in results])
    row(
        "late after the ETA, p50 / p99 / max (s)",
        [
            f"{_quantile(r.lateness, 0.5)} / {_quantile(r.lateness, 0.99)} / "
            f"{max(r.lateness, default=0):.2f}"
            for r in results
        ],
    )
    row("started before the ETA", [sum(1 for x in r.lateness if x < 0) for r in results])
    row(
        "tasks run / distinct / duplicates / missing",
        [f"{r.runs:,} / {r.distinct:,} / {r.duplicates} / {r.missing}" for r in results],
    )
    row("leases lost (worker log)", [r.lost_leases for r in results])
    row("errors in the worker log", [r.errors for r in results])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--low", type=float, default=60.0, help="shortest countdown (s)")
    parser.add_argument("--high", type=float, default=900.0, help="longest countdown (s)")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--quick", action="store_true", help="300 tasks over 60-120 s")
    parser.add_argument("--smoke", action="store_true", help="20 tasks over 3-8 s")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.low, args.high = 300, 60.0, 120.0
    if args.smoke:
        args.tasks, args.low, args.high = 20, 3.0, 8.0
    waits = countdowns(args.tasks, args.low, args.high, args.seed)
    started = time.monotonic()
    with TemporaryDirectory() as workdir, ThreadPoolExecutor(len(SIDES)) as pool:
        results = list(pool.map(lambda side: run_side(side, waits, Path(workdir)), SIDES))
    print(
        f"{args.tasks:,} tasks, countdowns uniform over {args.low:g}-{args.high:g} s "
        f"(seed {args.seed}), one worker ({SETUP.label}) per side, the three at once.\n"
    )
    print(table(results))
    print()
    command = " ".join(["python benchmarks/countdowns.py", *sys.argv[1:]])
    print(environment(command, time.monotonic() - started))
    bad = [r.side for r in results if r.distinct != r.published or r.duplicates or r.missing]
    if bad:
        print(f"\nNot every task ran exactly once: {', '.join(bad)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
