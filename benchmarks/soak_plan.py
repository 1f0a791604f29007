"""The chaos soak's seeded schedule: what the driver does to the workers and to SQS, and when.

Pure: times are seconds from the start of the chaos, drawn from a ``random.Random`` the
caller seeds, so that a run's schedule comes back with its seed, and a test checks it
without sleeping. The driver (``soak_driver.py``) carries it out and logs what it did.

The first disruptions are every kind once, in a seeded order, so that a short run meets
them all; the rest are drawn by weight. Two rules keep the verdicts readable:

* the ``steady`` worker slots are never stopped (only their connection is dropped), so
  that their memory is measured over the whole run;
* the fault windows on renewals (throttling, 5xx) stay shorter than the renewal margin
  (``ChaosSettings.blip_max``) and a margin apart (two back to back are one window as
  long as both), and only an ``outage`` lasts longer than the lease: a task that runs
  twice must then have been SIGKILLed or cut off by an outage.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal, get_args

DisruptionKind = Literal[
    "sigterm",
    "sigkill",
    "drop_connection",
    "throttle",
    "server_errors",
    "slow_deletes",
    "failing_deletes",
    "outage",
    "monitor",
]
KINDS: tuple[DisruptionKind, ...] = get_args(DisruptionKind)

#: How often each kind is drawn after the first round: workers' deaths and SQS's blips are
#: what production sees most; an outage longer than the lease, rarely.
WEIGHTS: dict[DisruptionKind, float] = {
    "sigterm": 2,
    "sigkill": 2,
    "drop_connection": 2,
    "throttle": 2,
    "server_errors": 2,
    "slow_deletes": 2,
    "failing_deletes": 2,
    "outage": 0.5,
    "monitor": 1,
}

#: The kinds that stop a worker; the driver restarts it ``seconds`` after it exits.
STOPS: tuple[DisruptionKind, ...] = ("sigterm", "sigkill")


@dataclass(frozen=True)
class Disruption:
    """One thing the driver does, ``at`` seconds into the chaos.

    ``seconds``: how long it lasts: a stopped worker's wait before its restart, a fault
    window, a slow delete's delay, a monitor's life before it is killed. ``count``: how
    many calls a counted fault hits. ``worker``: the slot, for what is done to a worker.
    """

    at: float
    kind: DisruptionKind
    seconds: float
    worker: int | None = None
    count: int = 0


@dataclass(frozen=True)
class ChaosSettings:
    """The run's shape, as the schedule needs it."""

    duration: float
    lease: float
    workers: int = 3
    #: Slots 0 .. steady-1 are never stopped.
    steady: int = 1
    mean_gap: float = 4.0
    #: No disruption before this (the workers settle) or in the last ``quiet_tail`` s.
    quiet_start: float = 5.0
    quiet_tail: float = 15.0
    #: How long a SIGTERMed worker may take to stop before the driver SIGKILLs it.
    grace: float = 20.0

    @property
    def blip_max(self) -> float:
        """The longest throttling or 5xx window: under half the transport's renewal margin
        (at most half the lease), so that retried renewals keep every lease."""
        return self.lease / 4

    @property
    def blip_spacing(self) -> float:
        """Time without such a window between two: the transport's renewal margin (half
        the lease), so that a lease's retries meet at most one window."""
        return self.lease / 2


def plan_chaos(settings: ChaosSettings, rng: random.Random) -> list[Disruption]:
    """The disruptions of one run, in time order."""
    round_one = list(KINDS)
    rng.shuffle(round_one)
    planner = _Planner(settings, rng)
    end = settings.duration - settings.quiet_tail
    at = settings.quiet_start
    while at < end:
        kind = round_one[0] if round_one else _weighted(rng)
        if planner.add(kind, at) and round_one:
            round_one.pop(0)
        at += rng.uniform(0.5, 1.5) * settings.mean_gap
    return planner.plan


def _weighted(rng: random.Random) -> DisruptionKind:
    return rng.choices(KINDS, weights=[WEIGHTS[kind] for kind in KINDS])[0]


class _Planner:
    """The schedule so far, and what it holds busy: down slots, an outage under way."""

    def __init__(self, settings: ChaosSettings, rng: random.Random) -> None:
        self.settings = settings
        self.rng = rng
        self.plan: list[Disruption] = []
        self._down_until = [0.0] * settings.workers
        self._outage_until = 0.0
        self._blips_until = 0.0

    def add(self, kind: DisruptionKind, at: float) -> bool:
        """Plan ``kind`` at ``at`` if it can happen then; whether it was planned."""
        disruption = self._draw(kind, at)
        if disruption is None:
            return False
        self.plan.append(disruption)
        return True

    def _draw(self, kind: DisruptionKind, at: float) -> Disruption | None:
        rng, settings = self.rng, self.settings
        if kind in STOPS:
            return self._stop(kind, at)
        if kind == "drop_connection":
            slot = self._up_slot(at, range(settings.workers))
            return None if slot is None else Disruption(at, kind, 0.0, worker=slot)
        if kind == "outage":
            if at < self._outage_until:
                return None
            seconds = round(rng.uniform(1.3, 2.0) * settings.lease, 1)
            self._outage_until = at + seconds + settings.lease
            return Disruption(at, kind, seconds)
        if kind in ("throttle", "server_errors"):
            if at < self._blips_until:
                return None
            seconds = round(rng.uniform(0.3, 1.0) * settings.blip_max, 1)
            self._blips_until = at + seconds + settings.blip_spacing
            return Disruption(at, kind, seconds)
        if kind == "slow_deletes":
            seconds = round(rng.uniform(0.5, 2.0) * settings.blip_max, 1)
            return Disruption(at, kind, seconds, count=rng.randint(2, 5))
        if kind == "failing_deletes":
            return Disruption(at, kind, 0.0, count=rng.randint(2, 6))
        return Disruption(at, kind, round(rng.uniform(5.0, 15.0), 1))

    def _stop(self, kind: DisruptionKind, at: float) -> Disruption | None:
        slot = self._up_slot(at, range(self.settings.steady, self.settings.workers))
        if slot is None:
            return None
        restart_after = round(self.rng.uniform(1.0, 4.0), 1)
        stopping = self.settings.grace if kind == "sigterm" else 0.0
        self._down_until[slot] = at + stopping + restart_after
        return Disruption(at, kind, restart_after, worker=slot)

    def _up_slot(self, at: float, slots: range) -> int | None:
        up = [slot for slot in slots if self._down_until[slot] <= at]
        return self.rng.choice(up) if up else None


TaskShape = Literal["short", "long", "parked", "large", "fifo", "released", "retried"]
SHAPES: tuple[TaskShape, ...] = get_args(TaskShape)
#: A FIFO group's size: enough for an order to be broken.
FIFO_GROUP = 3


@dataclass(frozen=True)
class PlannedTask:
    """One task the producer sends, ``at`` seconds into the run."""

    at: float
    shape: TaskShape
    #: The FIFO group and the task's place in it, for ``fifo`` tasks.
    group: str | None = None
    seq: int = 0


def plan_tasks(duration: float, rate: float, rng: random.Random) -> list[PlannedTask]:
    """The tasks of one run: every shape in turn (in a seeded order each round), ``rate``
    a second on average; a ``fifo`` turn is a whole group of :data:`FIFO_GROUP`."""
    tasks: list[PlannedTask] = []
    shapes: list[TaskShape] = []
    groups = 0
    at = 0.0
    while at < duration:
        if not shapes:
            shapes = list(SHAPES)
            rng.shuffle(shapes)
        shape = shapes.pop(0)
        if shape == "fifo":
            groups += 1
            tasks += [PlannedTask(at, shape, f"g{groups}", seq) for seq in range(FIFO_GROUP)]
        else:
            tasks.append(PlannedTask(at, shape))
        at += rng.uniform(0.5, 1.5) / rate
    return tasks
