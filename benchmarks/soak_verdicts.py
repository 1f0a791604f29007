"""The chaos soak's verdicts: what ran, what ran twice and why, what broke a FIFO group's order.

Pure: it reads what the run recorded (the tasks published, each run and receive the
workers wrote, the driver's SIGKILLs and outages) and judges, with no clock and no I/O.

At-least-once allows a second run only where the first worker could not delete the
message: it was SIGKILLed after it took the task, or an outage longer than the lease cut
it off while it held the message. One more is Celery's own, named apart: a prefork
worker that is stopping drops the jobs whose start no child has reported yet, one a
child has taken included (``AsynPool.flush``), and never acks them, on any broker.
Any other second run is a defect, and so reported.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

#: A run's outcome, as the soak's tasks record it: ``failed`` is a planned failure (the
#: message is released and runs again), ``retry`` a run that published its retry.
Outcome = Literal["ok", "failed", "retry"]
Reason = Literal[
    "sigkilled",
    "cut off by an outage",
    "begun as its prefork worker stopped (Celery)",
    "its worker died by itself",
]


@dataclass(frozen=True)
class Published:
    task_id: str
    shape: str
    group: str | None = None
    seq: int = 0


@dataclass(frozen=True)
class TaskRun:
    """One run of a task, from the record its worker wrote at the run's end."""

    task_id: str
    worker: str
    start: float
    end: float
    outcome: Outcome


@dataclass(frozen=True)
class Receipt:
    """A worker's Celery got the task's message (``task_received``) at ``at``."""

    task_id: str
    worker: str
    at: float


@dataclass(frozen=True)
class Kill:
    """The driver SIGKILLed this worker (one incarnation, by its name) at ``at``."""

    worker: str
    at: float


@dataclass(frozen=True)
class OutageWindow:
    start: float
    seconds: float


@dataclass(frozen=True)
class Chaos:
    """What the driver did that may make SQS hand a message out again."""

    lease: float
    kills: Sequence[Kill] = ()
    outages: Sequence[OutageWindow] = ()
    #: Workers that exited by themselves: a defect the soak reports apart, named here so
    #: that the second runs it caused are told from the unexplained ones.
    crashes: Sequence[Kill] = ()
    #: How long before Celery's ``task_received`` the worker may have received the
    #: message from SQS: a solo worker delivers it only once its running task ends.
    receive_slack: float = 0.0
    #: The warm shutdowns (SIGTERM) the driver asked for, and whether the pool is prefork.
    warm_stops: Sequence[Kill] = ()
    prefork: bool = False


@dataclass(frozen=True)
class Duplicate:
    """A run beyond the task's planned ones, and what explains it (None: nothing)."""

    task_id: str
    shape: str
    run: TaskRun
    reason: Reason | None


@dataclass
class Tally:
    """One pool's verdict on its tasks."""

    published: int = 0
    ran_once: int = 0
    lost: list[str] = field(default_factory=list)
    duplicates: list[Duplicate] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    runs: int = 0

    @property
    def unexplained(self) -> list[Duplicate]:
        return [d for d in self.duplicates if d.reason is None]

    def duplicates_by_reason(self) -> dict[str, int]:
        return dict(collections.Counter(d.reason or "unexplained" for d in self.duplicates))


def judge(
    published: Iterable[Published],
    runs: Iterable[TaskRun],
    receipts: Iterable[Receipt],
    chaos: Chaos,
) -> Tally:
    """Every published task's fate, and the FIFO groups' order."""
    tasks = list(published)
    by_task: dict[str, list[TaskRun]] = collections.defaultdict(list)
    all_runs = sorted(runs, key=lambda run: run.start)
    for run in all_runs:
        by_task[run.task_id].append(run)
    received: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for receipt in receipts:
        received[receipt.task_id, receipt.worker].append(receipt.at)
    tally = Tally(published=len(tasks), runs=len(all_runs))
    for task in tasks:
        task_runs = by_task.get(task.task_id, [])
        if not any(run.outcome == "ok" for run in task_runs):
            tally.lost.append(task.task_id)
            continue
        extra = [
            Duplicate(task.task_id, task.shape, run, explain(run, earlier, received, chaos))
            for run, earlier in beyond_plan(task_runs)
        ]
        tally.duplicates += extra
        tally.ran_once += not extra
    tally.out_of_order = out_of_order(tasks, by_task)
    return tally


def beyond_plan(task_runs: Sequence[TaskRun]) -> list[tuple[TaskRun, list[TaskRun]]]:
    """The runs of one task beyond its plan (one ``ok``, at most one ``retry``), each with
    the runs before it that may have left its message undeleted.

    Planned failures are not counted: a failed run's message is released to run again.
    """
    extra = []
    seen: collections.Counter[Outcome] = collections.Counter()
    for index, run in enumerate(task_runs):
        if run.outcome == "failed":
            continue
        seen[run.outcome] += 1
        if seen[run.outcome] > 1:
            earlier = [r for r in task_runs[:index] if r.outcome != "failed"]
            extra.append((run, earlier))
    return extra


def explain(
    run: TaskRun,
    earlier: Sequence[TaskRun],
    received: dict[tuple[str, str], list[float]],
    chaos: Chaos,
) -> Reason | None:
    """Why SQS handed out the message of ``run`` again after an ``earlier`` run, if it may.

    SIGKILLed: the earlier run's worker was killed after the run started and before this
    one did: it ran the task, or held its message, and never deleted it.

    Cut off by an outage: an outage longer than the lease began while one of the two
    workers held the message (from its receive, less ``receive_slack``, or its run's
    start if no receive was recorded, to a lease after its run's end, the longest a
    confirmed delete may take) and before the other run started: no renewal could reach
    SQS for a whole lease. The
    one cut off may run second: it received the message first, and kept the copy it had.

    Begun as its prefork worker stopped: the earlier run started after its prefork
    worker was sent SIGTERM. Celery's pool, stopping, ignores a job whose start no child
    has reported, even one a child runs, and never acks it; the channel's close then
    releases the message (or its lease runs out) and another worker runs it again. On
    Redis too; the transport cannot tell such a job from one never handed to a child.

    Its worker died by itself: as a SIGKILL, but a defect (``Chaos.crashes``), looked at
    only when nothing the driver did explains the run.
    """
    for before in earlier:
        if _ended_between(before, run, chaos.kills):
            return "sigkilled"
    for before in earlier:
        for held, other in ((before, run), (run, before)):
            took = [t for t in received.get((held.task_id, held.worker), []) if t <= held.start]
            held_from = max(took, default=held.start) - chaos.receive_slack
            held_until = min(held.end + chaos.lease, other.start)
            if any(
                outage.seconds > chaos.lease and held_from <= outage.start <= held_until
                for outage in chaos.outages
            ):
                return "cut off by an outage"
    if chaos.prefork and any(_begun_after(before, chaos.warm_stops) for before in earlier):
        return "begun as its prefork worker stopped (Celery)"
    if any(_ended_between(before, run, chaos.crashes) for before in earlier):
        return "its worker died by itself"
    return None


def _ended_between(before: TaskRun, run: TaskRun, ends: Sequence[Kill]) -> bool:
    """The worker of ``before`` ended after that run started and before ``run`` did."""
    return any(end.worker == before.worker and before.start <= end.at <= run.start for end in ends)


def _begun_after(before: TaskRun, stops: Sequence[Kill]) -> bool:
    """The run ``before`` started after its worker was told to stop."""
    return any(stop.worker == before.worker and stop.at <= before.start for stop in stops)


#: Why an S3 object of a finished task may stay in the bucket on purpose, by task id.
KEPT_LOST_LEASE = "its lease lost before its delete"
KEPT_SIGKILLED = "its worker SIGKILLed before the object's delete"


def objects_kept(
    runs: Sequence[TaskRun], kills: Sequence[Kill], lost_leases: Iterable[str], lease: float
) -> dict[str, str]:
    """The tasks whose S3 object may stay, and why: the bucket's lifecycle rule removes it.

    A worker deletes a message's object once SQS confirmed the message's delete. Its lease
    reported lost: SQS answers a delete by an expired receipt handle with success whether
    or not it deleted, so the object stays. Its last run's worker SIGKILLed from the run's
    start to a lease after its end (the longest a confirmed delete may take): the delete
    may have landed while its answer, and the object's delete, died with the worker (the
    30-minute gevent soak: killed 3.4 s after the run, its delete held 3.2 s by a slow
    delete fault).
    """
    kept = dict.fromkeys(lost_leases, KEPT_LOST_LEASE)
    last: dict[str, TaskRun] = {}
    for run in runs:
        if run.task_id not in last or run.end > last[run.task_id].end:
            last[run.task_id] = run
    for task_id, run in last.items():
        if task_id not in kept and any(
            kill.worker == run.worker and run.start <= kill.at <= run.end + lease
            for kill in kills
        ):
            kept[task_id] = KEPT_SIGKILLED
    return kept


def out_of_order(tasks: Sequence[Published], by_task: dict[str, list[TaskRun]]) -> list[str]:
    """FIFO tasks that started before a completed run of the task ahead of them in their
    group: SQS hands out a group's next message only once the one before is deleted."""
    groups: dict[str, list[Published]] = collections.defaultdict(list)
    for task in tasks:
        if task.group is not None:
            groups[task.group].append(task)
    broken = []
    for members in groups.values():
        members.sort(key=lambda task: task.seq)
        for ahead, behind in itertools.pairwise(members):
            done_ahead = [r.end for r in by_task.get(ahead.task_id, []) if r.outcome == "ok"]
            starts = [r.start for r in by_task.get(behind.task_id, [])]
            if starts and (not done_ahead or min(starts) < min(done_ahead)):
                broken.append(behind.task_id)
    return broken


@dataclass(frozen=True)
class MemoryVerdict:
    """A worker's resident memory after its warm-up and at the end, in bytes."""

    worker: str
    start: int
    end: int
    allowed: int

    @property
    def ok(self) -> bool:
        return self.end - self.start <= self.allowed


def memory_verdict(
    worker: str,
    samples: Sequence[tuple[float, int]],
    since: float,
    margin_bytes: int,
    margin_ratio: float,
) -> MemoryVerdict | None:
    """Memory at the end against the first sample at or after ``since``, the end of the
    worker's warm-up; None if it lived too short.

    The allowance is the larger of the margins: a fixed one for a small worker, a
    fraction of its size for a large prefork pool.
    """
    after = [(t, rss) for t, rss in samples if t >= since]
    if len(after) < 2:
        return None
    start, end = after[0][1], after[-1][1]
    return MemoryVerdict(worker, start, end, max(margin_bytes, int(start * margin_ratio)))
