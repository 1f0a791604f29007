"""SQS renewal requests against the floor and the .NET rule: a virtual-clock simulation.

SQS bills a ChangeMessageVisibility(Batch) call, not an entry, so the cost of keeping long
tasks invisible is the number of *calls*. This replays one synthetic workload against
each strategy without SQS and without sleeping: deterministic for a seed, minutes of CPU.

**Workload** (GitHub issue 9): Poisson arrivals at the rate that keeps ``N`` tasks in
flight on average (Little's law: rate = N / mean duration), lognormal durations (median
120 s, sigma 1, mean 198 s), a 30 s lease, each task on one of ``Q`` queues at random.
A warm-up (30 min) fills the worker before counting starts.

**Strategies**

* *floor*: every renewal gains ``visibility_timeout - 5 s`` (renewed 5 s before expiry,
  the margin the .NET rule keeps) and every call carries 10 entries of one queue: per
  queue, the entries a task of ``d`` seconds needs in the window, over 10. Not reachable
  (it ignores check ticks and arrival order); the yardstick of the issue.
* *.NET rule*: the AWS Message Processing Framework for .NET: every 1 s, every lease within
  5 s of expiry and not already being renewed gets a full lease, 10 per call per queue;
  its calls are all sent at once (no bound on calls in flight).
* *ours*: the package's real :class:`~celery_sqs_heartbeat.leasing.book.LeaseBook` and
  :class:`~celery_sqs_heartbeat.leasing.leases.AdaptiveMargin`, driven as
  :class:`~celery_sqs_heartbeat.leasing.manager.VisibilityExtensionManager` drives them: a check
  every interval (1 s) after the previous check's pass ended; a pass takes at most
  ``BATCHES_PER_HOLD`` calls per hold and at most ``MAX_CALLS_IN_FLIGHT`` on the wire,
  waiting for an answer when they are all out; each answer settles its batch and feeds
  its delay (answer time minus the pass's start) to the margin. Variants: the defaults
  with 10 calls in flight (botocore's default connection pool), and the behaviour before
  issue 9 (fixed threshold 10 s, calls one after another).

**Latency** (``--latency S``): every renewal call is answered ``S`` seconds after it is
sent. A lease *lapses* when a renewal lands (answer time: the worst case of "somewhere
during the call") after the lease ran out, or when its task acks after that: SQS would
have handed the task to another worker. "min remaining" is the smallest time a lease had
left when a renewal landed. The lease's next expiry is counted from the *send* time, as
the manager reckons it, so both ends are taken on the unsafe side.

Simplifications: a lease ends at the ack (the real manager renews it until SQS confirms
the delete, up to ``ack_batch_interval`` later); the real thread also wakes to send due
deletes, which only makes its checks more frequent; every call succeeds.

    python benchmarks/renewal_requests.py                  # 10 to 10,000 in flight, 0 and 2 s
    python benchmarks/renewal_requests.py --smoke          # seconds: keeps the script working
    python benchmarks/renewal_requests.py --markdown FILE  # the report to FILE as well
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from celery_sqs_heartbeat.aws.clients import MAX_CALLS_IN_FLIGHT  # noqa: E402
from celery_sqs_heartbeat.aws.sqs_facts import SQS_BATCH_SIZE  # noqa: E402
from celery_sqs_heartbeat.leasing.book import LeaseBook  # noqa: E402
from celery_sqs_heartbeat.leasing.call_starter import BATCHES_PER_HOLD  # noqa: E402
from celery_sqs_heartbeat.leasing.leases import EntryResult, Lease, LeasePolicy  # noqa: E402
from celery_sqs_heartbeat.leasing.schedule import LOOKS_PER_BATCH, RenewalBatch  # noqa: E402

#: What the floor and the .NET rule keep before expiry.
DOTNET_MARGIN = 5.0
DOTNET_TICK = 1.0
INTERVAL = 1.0


@dataclass(frozen=True)
class Workload:
    in_flight: int
    queues: int
    latency: float
    hours: float
    warmup: float
    seed: int
    median: float = 120.0
    sigma: float = 1.0
    lease: int = 30

    @property
    def end(self) -> float:
        return self.warmup + self.hours * 3600.0

    def counted(self, t: float) -> bool:
        return self.warmup <= t < self.end


@dataclass(frozen=True)
class Task:
    number: int
    received: float
    acked: float
    queue: int


def tasks_of(workload: Workload) -> list[Task]:
    """Poisson arrivals keeping ``in_flight`` on average, until the end of the window."""
    rng = random.Random(f"{workload.seed}/{workload.in_flight}/{workload.queues}")
    mean = workload.median * math.exp(workload.sigma**2 / 2)
    rate = workload.in_flight / mean
    mu = math.log(workload.median)
    tasks, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= workload.end:
            return tasks
        duration = rng.lognormvariate(mu, workload.sigma)
        tasks.append(Task(len(tasks), t, t + duration, rng.randrange(workload.queues)))


@dataclass
class Tally:
    """Calls and entries in the counted window; safety over the whole run."""

    calls: int = 0
    entries: int = 0
    lapsed: int = 0
    min_remaining: float = math.inf
    _lapsed_tasks: set[int] = field(default_factory=set)

    def sent(self, workload: Workload, now: float, entries: int) -> None:
        if workload.counted(now):
            self.calls += 1
            self.entries += entries

    def landed(self, task: int, expires: float, now: float) -> None:
        """A renewal of ``task``'s lease, which ran out at ``expires``, landed at ``now``."""
        self.min_remaining = min(self.min_remaining, expires - now)
        if expires < now:
            self.lapse(task)

    def lapse(self, task: int) -> None:
        if task not in self._lapsed_tasks:
            self._lapsed_tasks.add(task)
            self.lapsed += 1


def floor_calls(workload: Workload, tasks: Sequence[Task]) -> float:
    """Per queue, renewals gaining ``lease - 5 s`` each, 10 per call."""
    gain = workload.lease - DOTNET_MARGIN
    entries = [0] * workload.queues
    for task in tasks:
        expires = task.received + workload.lease
        while expires < task.acked:
            renewed_at = expires - DOTNET_MARGIN
            if workload.counted(renewed_at):
                entries[task.queue] += 1
            expires += gain
    return sum(count / SQS_BATCH_SIZE for count in entries)


class _Events:
    """A virtual clock: (time, order, sequence, action) run in time order."""

    ANSWER, TASK, CHECK = 0, 1, 2

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Callable[[float], None]]] = []
        self._sequence = itertools.count()

    def at(self, when: float, order: int, action: Callable[[float], None]) -> None:
        heapq.heappush(self._heap, (when, order, next(self._sequence), action))

    def run(self, until: float) -> None:
        while self._heap and self._heap[0][0] < until:
            when, _, _, action = heapq.heappop(self._heap)
            action(when)


def _schedule_tasks(
    events: _Events,
    tasks: Sequence[Task],
    receive: Callable[[Task, float], None],
    ack: Callable[[Task, float], None],
) -> None:
    for task in tasks:
        events.at(task.received, _Events.TASK, lambda now, task=task: receive(task, now))
        events.at(task.acked, _Events.TASK, lambda now, task=task: ack(task, now))


class OursSimulation:
    """The manager's renewal passes over the real LeaseBook, on a virtual clock."""

    def __init__(self, workload: Workload, threshold: float | None, calls_in_flight: int) -> None:
        self.workload = workload
        self.calls_in_flight = calls_in_flight
        self.policy = LeasePolicy(visibility_timeout=workload.lease, threshold=threshold)
        self.book = LeaseBook()
        self.book.margin.interval = INTERVAL
        self.events = _Events()
        self.tally = Tally()
        self.leases: dict[int, Lease] = {}
        #: When SQS lets each task's message go, as far as the simulation is concerned.
        self.expires: dict[int, float] = {}
        self.on_wire = 0
        self.pass_started: float | None = None
        self.pass_waiting = False

    def run(self, tasks: Sequence[Task]) -> Tally:
        _schedule_tasks(self.events, tasks, self.receive, self.ack)
        self.events.at(INTERVAL, _Events.CHECK, self.start_pass)
        self.events.run(self.workload.end + self.workload.lease)
        return self.tally

    def receive(self, task: Task, now: float) -> None:
        lease = Lease(f"rh-{task.number}", f"q{task.queue}", self.policy, now, str(task.number))
        self.leases[task.number] = lease
        self.expires[task.number] = now + self.workload.lease
        self.book.add(lease)

    def ack(self, task: Task, now: float) -> None:
        if self.expires[task.number] < now:
            self.tally.lapse(task.number)
        self.book.end(self.leases.pop(task.number))

    def start_pass(self, now: float) -> None:
        self.pass_started = now
        self.continue_pass(now)

    def continue_pass(self, now: float) -> None:
        """Take calls while a slot is free; wait for an answer when none is; then rest."""
        assert self.pass_started is not None
        while self.on_wire < self.calls_in_flight:
            room = min(self.calls_in_flight - self.on_wire, BATCHES_PER_HOLD)
            batches = self.book.due_batches(now, limit=room)
            self.book.take_exhausted(now, limit=room * LOOKS_PER_BATCH)
            for batch in batches:
                self.send(batch, now, self.pass_started)
            if not self.book.has_due(now):
                self.pass_started = None
                self.events.at(now + INTERVAL, _Events.CHECK, self.start_pass)
                return
        self.pass_waiting = True

    def send(self, batch: RenewalBatch, now: float, pass_started: float) -> None:
        self.on_wire += 1
        self.tally.sent(self.workload, now, len(batch.entries))
        answered = now + self.workload.latency
        self.events.at(answered, _Events.ANSWER, lambda at: self.answer(batch, at, pass_started))

    def answer(self, batch: RenewalBatch, now: float, pass_started: float) -> None:
        self.on_wire -= 1
        for lease, length in batch.entries:
            if lease.ended:
                continue
            number = int(lease.task_id or 0)
            self.tally.landed(number, self.expires[number], now)
            self.expires[number] = batch.sent_at + length
        self.book.margin.record_delay(now - pass_started, now)
        results = {lease: (EntryResult.OK, "") for lease, _ in batch.entries}
        self.book.settle(batch, results, now)
        if self.pass_waiting:
            self.pass_waiting = False
            self.continue_pass(now)


class DotnetSimulation:
    """Every second, every lease within 5 s of expiry and not on the wire, 10 per call."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.events = _Events()
        self.tally = Tally()
        self.heaps: list[list[tuple[float, int]]] = [[] for _ in range(workload.queues)]
        self.expires: dict[int, float] = {}
        self.queue_of: dict[int, int] = {}

    def run(self, tasks: Sequence[Task]) -> Tally:
        _schedule_tasks(self.events, tasks, self.receive, self.ack)
        self.events.at(DOTNET_TICK, _Events.CHECK, self.tick)
        self.events.run(self.workload.end + self.workload.lease)
        return self.tally

    def receive(self, task: Task, now: float) -> None:
        self.expires[task.number] = now + self.workload.lease
        self.queue_of[task.number] = task.queue
        heapq.heappush(self.heaps[task.queue], (self.expires[task.number], task.number))

    def ack(self, task: Task, now: float) -> None:
        if self.expires.pop(task.number) < now:
            self.tally.lapse(task.number)

    def tick(self, now: float) -> None:
        for heap in self.heaps:
            due = []
            while heap and heap[0][0] <= now + DOTNET_MARGIN:
                expires, number = heapq.heappop(heap)
                if self.expires.get(number) == expires:
                    due.append(number)
            for start in range(0, len(due), SQS_BATCH_SIZE):
                self.send(due[start : start + SQS_BATCH_SIZE], now)
        self.events.at(now + DOTNET_TICK, _Events.CHECK, self.tick)

    def send(self, numbers: list[int], now: float) -> None:
        self.tally.sent(self.workload, now, len(numbers))
        answered = now + self.workload.latency
        self.events.at(answered, _Events.ANSWER, lambda at: self.answer(numbers, now, at))

    def answer(self, numbers: list[int], sent: float, now: float) -> None:
        for number in numbers:
            if number not in self.expires:
                continue
            self.tally.landed(number, self.expires[number], now)
            self.expires[number] = sent + self.workload.lease
            heapq.heappush(self.heaps[self.queue_of[number]], (self.expires[number], number))


Strategy = Callable[[Workload, Sequence[Task]], Tally]

OURS = "ours (defaults)"
DOTNET = ".NET rule"
STRATEGIES: dict[str, Strategy] = {
    OURS: lambda w, t: OursSimulation(w, None, MAX_CALLS_IN_FLIGHT).run(t),
    DOTNET: lambda w, t: DotnetSimulation(w).run(t),
    "ours, 10 calls in flight": lambda w, t: OursSimulation(w, None, 10).run(t),
    "before (threshold 10 s, one call at a time)": lambda w, t: OursSimulation(w, 10.0, 1).run(t),
}


@dataclass
class Row:
    workload: Workload
    strategy: str
    calls: list[float]
    entries: list[float]
    floors: list[float]
    lapsed: int
    min_remaining: float


def measure(workloads: Sequence[Workload], seeds: int) -> list[Row]:
    rows = []
    for workload in workloads:
        runs: dict[str, list[Tally]] = {name: [] for name in STRATEGIES}
        floors = []
        for seed in range(workload.seed, workload.seed + seeds):
            seeded = Workload(**{**workload.__dict__, "seed": seed})
            tasks = tasks_of(seeded)
            floors.append(floor_calls(seeded, tasks))
            for name, strategy in STRATEGIES.items():
                runs[name].append(strategy(seeded, tasks))
        for name, tallies in runs.items():
            rows.append(
                Row(
                    workload,
                    name,
                    [t.calls for t in tallies],
                    [t.entries for t in tallies],
                    floors,
                    sum(t.lapsed for t in tallies),
                    min(t.min_remaining for t in tallies),
                )
            )
    return rows


def markdown(rows: Sequence[Row]) -> str:
    """Medians over the seeds; ratios are medians of per-seed ratios."""
    lines = [
        "| in flight | queues | latency | strategy | calls/h | x floor | x .NET rule "
        "| entries/call | leases lapsed | min remaining when a renewal landed (s) |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    by_workload: dict[Workload, list[Row]] = {}
    for row in rows:
        by_workload.setdefault(row.workload, []).append(row)
    for workload, group in by_workload.items():
        hours = workload.hours
        dotnet = next(row for row in group if row.strategy == DOTNET)
        floor = group[0].floors
        lines.append(
            f"| {workload.in_flight:,} | {workload.queues} | {workload.latency:g} s | floor "
            f"| {statistics.median(floor) / hours:,.0f} | 1.00 | "
            f"{_median_ratio(floor, dotnet.calls)} | 10.00 | - | - |"
        )
        for row in group:
            entries = sum(row.entries) / max(sum(row.calls), 1)
            lines.append(
                f"| {workload.in_flight:,} | {workload.queues} | {workload.latency:g} s "
                f"| {row.strategy} | {statistics.median(row.calls) / hours:,.0f} "
                f"| {_median_ratio(row.calls, floor)} | {_median_ratio(row.calls, dotnet.calls)} "
                f"| {entries:.2f} | {row.lapsed} | {row.min_remaining:.1f} |"
            )
    return "\n".join(lines)


def _median_ratio(values: Sequence[float], bases: Sequence[float]) -> str:
    ratios = [value / base for value, base in zip(values, bases, strict=True) if base]
    return f"{statistics.median(ratios):.2f}" if ratios else "-"


def environment(argv: Sequence[str]) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--", "celery_sqs_heartbeat", "benchmarks"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    dirty = sorted(line[3:] for line in changed if line.strip())
    versions = ", ".join(
        f"{name} {metadata.version(name)}" for name in ("celery", "kombu", "botocore")
    )
    return "\n".join(
        [
            f"Command: `{' '.join(['python', 'benchmarks/renewal_requests.py', *argv])}`",
            f"Machine: {_cpu()}, {platform.system()} {platform.release()} "
            f"{platform.machine()}; Python {platform.python_version()}, {versions}.",
            f"Package at `{commit or 'unknown'}`"
            + (f", uncommitted: {', '.join(dirty)}." if dirty else "."),
        ]
    )


def _cpu() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model})"


def main(argv: Sequence[str] | None = None) -> int:
    args_given = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--queues", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 2.0])
    parser.add_argument("--hours", type=float, default=1.0, help="virtual hours counted")
    parser.add_argument("--warmup-minutes", type=float, default=30.0)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per cell; medians")
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds")
    parser.add_argument("--markdown", type=Path, help="write the report here too")
    args = parser.parse_args(args_given)
    if args.smoke:
        args.in_flight, args.queues, args.latency = [10, 100], [1, 2], [0.0, 2.0]
        args.hours, args.warmup_minutes, args.seeds = 0.05, 5.0, 1
    workloads = [
        Workload(n, q, latency, args.hours, args.warmup_minutes * 60.0, args.seed)
        for n in args.in_flight
        for q in args.queues
        for latency in args.latency
    ]
    started = time.perf_counter()
    rows = measure(workloads, args.seeds)
    report = "\n\n".join(
        [
            f"Poisson arrivals keeping N in flight, lognormal durations (median 120 s, "
            f"sigma 1), 30 s lease, tasks spread over the queues at random; "
            f"{args.warmup_minutes:g} min warm-up, then {args.hours:g} h counted; "
            f"medians of {args.seeds} seed(s) from {args.seed}; "
            f"{time.perf_counter() - started:.0f} s of CPU.",
            markdown(rows),
            environment(args_given),
        ]
    )
    print(report)
    if args.markdown is not None:
        args.markdown.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
