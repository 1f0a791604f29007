"""What every scenario of ``worker_throughput.py`` shares: the sides, the worker set-ups,
one run's figures and the resolved command line.

Kept apart from the runner (``bench_workers.py``) so that the tables and the scenarios
can be read without the subprocess plumbing.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRANSPORTS = {"stock": "sqs", "ours": "celery_sqs_heartbeat:Transport"}
#: The options both sides get (``visibility_timeout`` is added per scenario).
BASE_OPTIONS: dict[str, Any] = {"region": "us-east-1", "is_secure": False, "wait_time_seconds": 1}
#: The lease of every no-op backlog (throughput, acks, receive), so that their stock rows
#: agree.
LEASE = 30
#: Actions shown in their own column; everything else is summed as "other".
MAIN_ACTIONS = (
    "ReceiveMessage",
    "DeleteMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibilityBatch",
    "ChangeMessageVisibility",
)


@dataclass(frozen=True)
class Setup:
    """A worker command line and any transport options added to :data:`BASE_OPTIONS`."""

    label: str
    pool: str
    concurrency: int
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Side:
    """One side of a comparison: the stock transport, ours, or a variant of ours.

    The label is what tables show; variants of ours differ only in ``options``, which
    are added to (and may override) the options every side gets.
    """

    label: str
    transport: str
    options: dict[str, Any] = field(default_factory=dict)


STOCK = Side("stock", TRANSPORTS["stock"])
OURS = Side("ours", TRANSPORTS["ours"])


def parse_setup(text: str) -> Setup:
    """``POOL:N``, as ``--setups`` takes it and as the scenarios spell their defaults."""
    pool, sep, concurrency = text.partition(":")
    if not sep or not pool or not concurrency.isdigit() or int(concurrency) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected POOL:CONCURRENCY, e.g. prefork:4")
    return Setup(f"{pool} -c {concurrency}", pool, int(concurrency))


@dataclass(frozen=True)
class Workload:
    """What a scenario gives every run of it, so that the sides differ only in transport.

    With ``window`` None the worker is stopped as soon as every message is deleted (or
    ``timeout`` runs out); otherwise it runs for ``window`` seconds after it is ready.
    ``idle``: seconds the worker is left with an empty queue after the last delete, its
    calls kept apart. ``exactly_once``: a task run twice or never is a violation to
    report at once (not so for long tasks, where stock's duplicates are the finding).
    """

    scenario: str
    task: str
    args: tuple[Any, ...]
    count: int
    lease: int
    timeout: float
    window: float | None = None
    poll: float = 0.25
    base_options: Mapping[str, Any] = field(default_factory=lambda: dict(BASE_OPTIONS))
    idle: float = 0.0
    exactly_once: bool = False
    #: Tasks published one at a time to the idle worker after ``idle``, each once the one
    #: before it started: their publish-to-start latency.
    probes: int = 0


def backlog(scenario: str, tasks: int) -> Workload:
    """The no-op backlog of the acks and receive scenarios, one shape so that their rows
    compare; the counters are read often, as a smoke run is over in a fraction of a second.
    """
    return Workload(
        scenario,
        "noop",
        (),
        tasks,
        LEASE,
        timeout=max(120.0, tasks * 0.5),
        poll=0.05,
        exactly_once=True,
    )


@dataclass
class Run:
    """One worker's run of one scenario with one transport."""

    scenario: str
    setup: str
    transport: str
    tasks: int
    order: int
    #: Seconds the server waited before answering each SQS call of the run.
    latency: float = 0.0
    #: The worker's ``broker_transport_options``.
    options: dict[str, Any] = field(default_factory=dict)
    #: First receive to last first-delete, on the server's clock (None: not all acked).
    seconds: float | None = None
    #: SQS calls by action from the worker's start until all messages were deleted (or
    #: the window ended), and batch entries by action.
    calls: dict[str, int] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)
    #: Calls made during the warm shutdown, by action.
    shutdown_calls: dict[str, int] = field(default_factory=dict)
    #: Calls made while the worker sat idle after the backlog, and for how long.
    idle_calls: dict[str, int] = field(default_factory=dict)
    idle_seconds: float = 0.0
    #: Seconds from the publish of each probe task (the send's start) to its start in
    #: the worker, on the idle worker; one per probe that ran.
    start_latencies: list[float] = field(default_factory=list)
    #: Executions per task id, from the record file, after the worker exited.
    executions: dict[str, int] = field(default_factory=dict)
    #: Published tasks that never ran, ran more than once, and executions of task ids that
    #: were never published (which would mean the record file is not this run's).
    missing: int = 0
    repeated: int = 0
    unknown: int = 0
    #: Outcome of every per-message delete the server saw for the run's queue ("ok",
    #: "stale": answered success but deleted nothing, or an error code).
    delete_results: dict[str, int] = field(default_factory=dict)
    all_acked: bool = False
    exit_code: int | None = None
    warnings: int = 0
    errors: int = 0
    log: str = ""

    @property
    def rate(self) -> float | None:
        return None if self.seconds is None else self.tasks / self.seconds

    @property
    def exactly_once(self) -> bool:
        return not (self.missing or self.repeated or self.unknown)

    @property
    def cell(self) -> tuple[float, str]:
        """Runs of one cell are compared side by side; tables have a row group per cell."""
        return self.latency, self.setup

    def per_task(self, action: str) -> float:
        return self.calls.get(action, 0) / self.tasks

    def other_per_task(self, shown: Sequence[str] = MAIN_ACTIONS) -> float:
        other = sum(n for action, n in self.calls.items() if action not in shown)
        return other / self.tasks

    def requests_per_task(self) -> float:
        return sum(self.calls.values()) / self.tasks


def backlog_failed(run: Run) -> bool:
    """A backlog is only measured when it was drained, and drained with every task run once."""
    return not run.all_acked or not run.exactly_once


def alternate(sides: Sequence[Side], reps: int) -> list[Side]:
    """``reps`` runs of each side, every other round in reverse (A B C, C B A, A B C, ...).

    A drift of the machine over a cell then hits every side about alike.
    """
    order: list[Side] = []
    for i in range(reps):
        order += list(sides) if i % 2 == 0 else list(reversed(sides))
    return order


@dataclass(frozen=True)
class Plan:
    """The command line with ``--smoke`` and ``--quick`` sizes resolved, in one place, so
    that every scenario reads the same figures and the report can name them."""

    tasks: int
    reps: int
    long_reps: int
    window: float
    latencies: list[float]
    ack_setups: list[Setup]
    receive_setups: list[Setup]
    sides: list[Side]
    task_seconds: float | None
    idle: float
    probes: int
    workdir: Path
    command: str
