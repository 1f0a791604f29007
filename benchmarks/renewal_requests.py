"""How many SQS renewal requests each lease-renewal strategy makes: a virtual-clock simulation.

SQS bills a ChangeMessageVisibility(Batch) call, not an entry, so the cost of keeping long
tasks invisible is the number of *calls*. This simulation replays one synthetic workload
against four strategies, without SQS and without sleeping, so it is deterministic for a
given seed and finishes in seconds:

* ``ours``: the package's real :class:`~celery_sqs_heartbeat.leases.LeaseBook`, driven
  the way :class:`~celery_sqs_heartbeat.manager.VisibilityExtensionManager` drives it
  (``take_exhausted`` then ``due_batches`` every ``interval``, every entry settled OK,
  ``end()`` at the ack), with the package defaults for a 30 s lease: interval 1 s,
  threshold 10 s.
* ``dotnet``: the AWS Message Processing Framework for .NET's rule with its defaults: every
  1 s, every lease within 5 s of expiry gets another full lease, in chunks of 10.
* ``nservicebus``: NServiceBus's SQS transport: one ChangeMessageVisibility per message,
  sent ``remaining - min(remaining / 2, 10 s)`` after the previous one.
* ``ideal``: a lower bound nobody can beat: each message renewed only at the very instant
  its lease runs out, by a full lease, and every call carrying exactly 10 entries.

Workload: ``N`` messages always in flight (when a task finishes, the next message is
received at that instant), task durations lognormal (median 120 s, sigma 1.0 by default),
a 30 s lease. A warm-up (30 min by default) lets the slots drift out of step before
counting; then ``--hours`` of virtual time are counted. Renewals are answered instantly:
this measures the scheduling rule, not network latency.

Usage: ``python benchmarks/renewal_requests.py [--hours H] [--seed S]``
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from celery_sqs_heartbeat.leases import EntryResult, Lease, LeaseBook, LeasePolicy

#: ChangeMessageVisibilityBatch takes at most ten entries.
BATCH = 10


@dataclass(frozen=True)
class Workload:
    """One simulated load: ``in_flight`` back-to-back task slots sharing one queue."""

    in_flight: int
    hours: float
    warmup: float
    seed: int
    median: float
    sigma: float
    lease: int

    @property
    def start(self) -> float:
        """Virtual time at which counting starts (end of the warm-up)."""
        return self.warmup

    @property
    def end(self) -> float:
        return self.warmup + self.hours * 3600.0

    def counted(self, t: float) -> bool:
        return self.start <= t < self.end


Task = tuple[float, float]  # (received at, acked at), virtual seconds


def task_slots(workload: Workload) -> list[list[Task]]:
    """The tasks of every slot, back to back from time 0 until past the end.

    Each slot has its own generator seeded from ``(seed, slot)``, so slot ``j`` runs the
    same tasks whatever ``N`` is, and every strategy sees exactly the same tasks.
    """
    mu = math.log(workload.median)
    slots = []
    for slot in range(workload.in_flight):
        rng = random.Random(f"{workload.seed}/{slot}")
        tasks: list[Task] = []
        t = 0.0
        # One lease past the end, so every task acked in time has a successor.
        while t < workload.end + workload.lease:
            duration = rng.lognormvariate(mu, workload.sigma)
            tasks.append((t, t + duration))
            t += duration
        slots.append(tasks)
    return slots


@dataclass
class Tally:
    """What one strategy did over the counted window (safety figures cover the whole run)."""

    calls: int = 0
    entries: int = 0
    #: Smallest ``expires_at - now`` seen when a renewal was sent; must stay > 0.
    min_remaining: float = math.inf
    #: Tasks still running when their lease had run out (a duplicate delivery on SQS).
    lapses: int = 0

    def renewal(self, workload: Workload, now: float, remaining: float, entries: int) -> None:
        """Record one call carrying ``entries`` renewals at ``now``."""
        self.min_remaining = min(self.min_remaining, remaining)
        if workload.counted(now):
            self.calls += 1
            self.entries += entries


@dataclass
class Row:
    strategy: str
    in_flight: int
    tally: Tally
    ideal_calls: float


def _finish_events(slots: Sequence[Sequence[Task]]) -> list[tuple[float, int, int]]:
    """A heap of (ack time, slot, task index) holding each slot's first task."""
    heap = [(tasks[0][1], slot, 0) for slot, tasks in enumerate(slots)]
    heapq.heapify(heap)
    return heap


def simulate_ours(
    workload: Workload, slots: Sequence[Sequence[Task]], interval: float, threshold: float
) -> Tally:
    """Drive the package's LeaseBook exactly as the manager thread does, on a virtual clock."""
    tally = Tally()
    book = LeaseBook()
    policy = LeasePolicy(visibility_timeout=workload.lease, threshold=threshold)
    queue = "bench-queue"
    current: list[Lease] = []
    for slot, tasks in enumerate(slots):
        lease = Lease(f"{slot}/0", queue, policy, received_at=tasks[0][0])
        book.add(lease)
        current.append(lease)
    finishes = _finish_events(slots)
    ticks = int(workload.end / interval)
    for tick in range(1, ticks + 1):
        now = tick * interval
        # Acks (and the receive of the next message) that happened since the last check.
        while finishes and finishes[0][0] <= now:
            acked_at, slot, index = heapq.heappop(finishes)
            lease = current[slot]
            if lease.expires_at < acked_at:
                tally.lapses += 1
            book.end(lease)
            nxt = index + 1
            lease = Lease(f"{slot}/{nxt}", queue, policy, received_at=slots[slot][nxt][0])
            book.add(lease)
            current[slot] = lease
            heapq.heappush(finishes, (slots[slot][nxt][1], slot, nxt))
        book.take_exhausted(now)
        for batch in book.due_batches(now):
            remaining = min(lease.expires_at - now for lease, _ in batch.entries)
            tally.renewal(workload, now, remaining, len(batch.entries))
            results = {lease: (EntryResult.OK, "") for lease, _ in batch.entries}
            book.settle(batch, results, now)
    return tally


def simulate_dotnet(
    workload: Workload, slots: Sequence[Sequence[Task]], interval: float, threshold: float
) -> Tally:
    """Every ``interval``, renew every lease within ``threshold`` of expiry, 10 per call."""
    tally = Tally()
    expires = [tasks[0][0] + workload.lease for tasks in slots]
    finishes = _finish_events(slots)
    ticks = int(workload.end / interval)
    for tick in range(1, ticks + 1):
        now = tick * interval
        while finishes and finishes[0][0] <= now:
            acked_at, slot, index = heapq.heappop(finishes)
            if expires[slot] < acked_at:
                tally.lapses += 1
            nxt = index + 1
            expires[slot] = slots[slot][nxt][0] + workload.lease
            heapq.heappush(finishes, (slots[slot][nxt][1], slot, nxt))
        due = [slot for slot, at in enumerate(expires) if at - now <= threshold]
        for start in range(0, len(due), BATCH):
            chunk = due[start : start + BATCH]
            remaining = min(expires[slot] - now for slot in chunk)
            tally.renewal(workload, now, remaining, len(chunk))
            for slot in chunk:
                expires[slot] = now + workload.lease
    return tally


def simulate_nservicebus(workload: Workload, slots: Sequence[Sequence[Task]]) -> Tally:
    """One call per renewal, each ``remaining - min(remaining / 2, 10 s)`` after the last.

    Event-driven (no check interval): NServiceBus runs one timer per message.
    """
    tally = Tally()
    for tasks in slots:
        for received, acked in tasks:
            if received >= workload.end:
                break
            expires = received + workload.lease
            while True:
                # At each renewal the remaining time is a full lease again.
                renew_at = expires - min(workload.lease / 2, 10.0)
                if renew_at >= acked:
                    break
                tally.renewal(workload, renew_at, expires - renew_at, 1)
                expires = renew_at + workload.lease
            if acked > expires:
                tally.lapses += 1
    return tally


def ideal_calls(workload: Workload, slots: Sequence[Sequence[Task]]) -> float:
    """Renewal entries strictly needed in the window, over 10.

    A message acked at ``d`` seconds after its receive needs at least
    ``ceil(d / lease) - 1`` renewals: each renewal at the instant the lease runs out,
    each buying a full lease. No safe strategy can do with fewer entries, nor with fewer
    calls than entries / 10.
    """
    entries = 0
    for tasks in slots:
        for received, acked in tasks:
            if received >= workload.end:
                break
            k = 1
            while received + k * workload.lease < acked:
                if workload.counted(received + k * workload.lease):
                    entries += 1
                k += 1
    return entries / BATCH


STRATEGIES: dict[str, Callable[[Workload, Sequence[Sequence[Task]]], Tally]] = {
    "ours (LeaseBook, 1 s / 10 s)": lambda w, s: simulate_ours(w, s, 1.0, 10.0),
    # Not a default: the same scheduler with .NET's 5 s threshold, to separate the cost of
    # the threshold from the cost of the batching rule.
    "ours, threshold 5 s (option)": lambda w, s: simulate_ours(w, s, 1.0, 5.0),
    ".NET framework (1 s / 5 s)": lambda w, s: simulate_dotnet(w, s, 1.0, 5.0),
    "NServiceBus (per message)": simulate_nservicebus,
}


def run(workload: Workload) -> list[Row]:
    slots = task_slots(workload)
    ideal = ideal_calls(workload, slots)
    rows = []
    for name, strategy in STRATEGIES.items():
        rows.append(Row(name, workload.in_flight, strategy(workload, slots), ideal))
    return rows


def markdown(rows: Sequence[Row], hours: float) -> str:
    """The result table; per-hour figures are over the counted window only."""
    lines = [
        "| in flight | strategy | calls/h | entries/h | entries/call | calls / ideal "
        "| calls / (own entries / 10) | min remaining at renewal (s) | leases lapsed |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for in_flight in sorted({row.in_flight for row in rows}):
        group = [row for row in rows if row.in_flight == in_flight]
        ideal = group[0].ideal_calls
        for row in group:
            t = row.tally
            lines.append(
                f"| {in_flight:,} | {row.strategy} | {t.calls / hours:,.0f} "
                f"| {t.entries / hours:,.0f} | {t.entries / max(t.calls, 1):.2f} "
                f"| {t.calls / ideal:.2f}x | {BATCH * t.calls / max(t.entries, 1):.2f}x "
                f"| {t.min_remaining:.1f} | {t.lapses} |"
            )
        lines.append(
            f"| {in_flight:,} | ideal (renew at expiry, 10 per call) | {ideal / hours:,.0f} "
            f"| {ideal * BATCH / hours:,.0f} | 10.00 | 1.00x | 1.00x | 0.0 | 0 |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=2.0, help="virtual hours counted")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup-minutes", type=float, default=30.0)
    parser.add_argument("--median", type=float, default=120.0, help="median task seconds")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma")
    parser.add_argument("--lease", type=int, default=30, help="visibility timeout (s)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 10, 100, 1000], metavar="N")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    for in_flight in args.in_flight:
        workload = Workload(
            in_flight=in_flight,
            hours=args.hours,
            warmup=args.warmup_minutes * 60.0,
            seed=args.seed,
            median=args.median,
            sigma=args.sigma,
            lease=args.lease,
        )
        rows.extend(run(workload))
    print(
        f"Workload: N in flight, lognormal task durations (median {args.median:g} s, "
        f"sigma {args.sigma:g}), {args.lease} s lease, {args.warmup_minutes:g} min warm-up "
        f"then {args.hours:g} h counted, seed {args.seed}.\n"
    )
    print(markdown(rows, args.hours))
    unsafe = [row for row in rows if row.tally.lapses or row.tally.min_remaining <= 0]
    return 1 if unsafe else 0


if __name__ == "__main__":
    sys.exit(main())
