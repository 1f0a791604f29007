"""The soak's result per pool, its checks, and the table ``docs/benchmarks.md`` shows.

Pure: it formats and judges what ``chaos_soak.py`` gathered.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from soak_verdicts import MemoryVerdict, Tally

#: The driver's acts that are faults (``restart``, ``exited``, ``calm`` ... are not).
FAULT_ACTS = (
    "sigterm",
    "sigkill",
    "drop_connection",
    "throttle",
    "server_errors",
    "slow_deletes",
    "failing_deletes",
    "outage",
    "monitor_kill",
)
MIB = 1024 * 1024


@dataclass
class Leftovers:
    """What the run left on the server that it did not mean to keep, after the reaper."""

    queues: list[str] = field(default_factory=list)
    subscriptions: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)
    #: Objects put by a publish whose SendMessage then failed (no message points at them).
    orphans: list[str] = field(default_factory=list)
    #: Messages still in the task queues: visible, in flight or delayed.
    messages: int = 0
    #: Objects kept on purpose and not counted, each named with why: its worker cannot know
    #: the object is free (``soak_verdicts.objects_kept``); the bucket's lifecycle rule
    #: removes them.
    kept: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return (
            len(self.queues)
            + len(self.subscriptions)
            + len(self.topics)
            + len(self.objects)
            + len(self.orphans)
            + self.messages
        )


@dataclass
class PoolResult:
    pool: str
    #: The chaos's length, and the whole run's (start-up, drain, reaper and stop too).
    minutes: float
    seconds: float
    tally: Tally
    acts: Sequence[dict[str, Any]]
    memory: Sequence[MemoryVerdict]
    leftovers: Leftovers
    #: Tasks published, by shape; countdowns a worker parked; what the reaper deleted.
    shapes: dict[str, int] = field(default_factory=dict)
    parked: int = 0
    reaped: int = 0
    #: Publishes tried again after a failure (an outage), and tasks never published.
    failed_publishes: int = 0
    given_up: int = 0

    def faults(self) -> dict[str, int]:
        """Faults injected, by kind; a SIGKILL after a warm shutdown's grace counts apart."""
        counts: collections.Counter[str] = collections.Counter()
        for act in self.acts:
            if act["kind"] in FAULT_ACTS:
                after_grace = act["kind"] == "sigkill" and act.get("after") == "grace"
                counts["sigkill (grace over)" if after_grace else act["kind"]] += 1
        return dict(counts)

    def crashes(self) -> list[dict[str, Any]]:
        """Workers that exited without being told to, or did not stop warm at the end
        (SIGKILLed after a minute): under chaos, a defect."""
        return [act for act in self.acts if act["kind"] in ("crashed", "stuck")]

    def checks(self) -> list[tuple[str, bool]]:
        """Each check the issue names, and whether it held."""
        tally = self.tally
        return [
            ("none lost", not tally.lost),
            ("no worker died by itself or hung", not self.crashes()),
            ("every duplicate explained", not tally.unexplained),
            ("FIFO order kept", not tally.out_of_order),
            ("nothing left behind", self.leftovers.count == 0),
            ("memory within margin", all(verdict.ok for verdict in self.memory)),
            ("memory measured", bool(self.memory)),
            ("countdowns parked", self.parked > 0),
        ]

    @property
    def passed(self) -> bool:
        return all(ok for _, ok in self.checks())


def table(results: Sequence[PoolResult]) -> str:
    """One markdown row per pool, as docs/benchmarks.md shows it."""
    head = (
        "| pool | chaos (run) | tasks | runs | faults injected | ran once | ran twice, why "
        "| lost | left behind | memory at end, MiB (after warm-up) | checks |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for result in results:
        tally = result.tally
        faults = ", ".join(f"{kind} {n}" for kind, n in sorted(result.faults().items()))
        twice = ", ".join(f"{why} {n}" for why, n in sorted(tally.duplicates_by_reason().items()))
        memory = ", ".join(
            f"{v.worker} {v.end / MIB:.0f} ({v.start / MIB:.0f})" for v in result.memory
        )
        failed = [name for name, ok in result.checks() if not ok]
        rows.append(
            f"| {result.pool} | {result.minutes:g} min ({result.seconds:.0f} s) "
            f"| {tally.published} | {tally.runs} "
            f"| {faults} | {tally.ran_once} | {twice or 'none'} | {len(tally.lost)} "
            f"| {_left(result.leftovers)} | {memory} "
            f"| {'pass' if not failed else 'FAIL: ' + ', '.join(failed)} |"
        )
    return "\n".join(rows)


def details(result: PoolResult) -> list[str]:
    """The lines that say what failed, for the person reading the run's output."""
    lines = []
    tally, left = result.tally, result.leftovers
    lines += [f"lost: {task_id}" for task_id in tally.lost]
    lines += [
        f"died by itself: {act['worker']} (exit status {act['code']}), see its log"
        if act["kind"] == "crashed"
        else f"did not stop warm within a minute: {act['worker']}"
        for act in result.crashes()
    ]
    lines += [
        f"unexplained second run: {d.task_id} ({d.shape}) on {d.run.worker} at {d.run.start:.1f}"
        for d in tally.unexplained
    ]
    lines += [f"out of order: {task_id}" for task_id in tally.out_of_order]
    lines += [f"left: queue {name}" for name in left.queues]
    lines += [f"left: subscription {name}" for name in left.subscriptions]
    lines += [f"left: topic {name}" for name in left.topics]
    lines += [f"left: S3 object {name}" for name in left.objects]
    lines += [f"left: S3 object of a failed publish {name}" for name in left.orphans]
    lines += [f"kept: S3 object {name}" for name in left.kept]
    if left.messages:
        lines.append(f"left: {left.messages} messages in the task queues")
    lines += [
        f"memory: {v.worker} grew {(v.end - v.start) / MIB:.1f} MiB (allowed {v.allowed / MIB:.1f})"
        for v in result.memory
        if not v.ok
    ]
    return lines


def summary(result: PoolResult) -> str:
    """What the run did, in a line: tasks by shape, parked countdowns, reaped leftovers."""
    shapes = ", ".join(f"{shape} {n}" for shape, n in sorted(result.shapes.items()))
    return (
        f"tasks: {shapes}; parked {result.parked}; failed publish tries "
        f"{result.failed_publishes}, given up {result.given_up}; reaped {result.reaped}"
    )


def _left(left: Leftovers) -> str:
    kept = f" (kept on purpose: {len(left.kept)} S3 objects)" if left.kept else ""
    if not left.count:
        return "0" + kept
    parts = {
        "queues": len(left.queues),
        "subscriptions": len(left.subscriptions),
        "topics": len(left.topics),
        "S3 objects": len(left.objects),
        "S3 objects of failed publishes": len(left.orphans),
        "messages": left.messages,
    }
    return ", ".join(f"{n} {kind}" for kind, n in parts.items() if n) + kept
