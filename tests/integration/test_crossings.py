"""Every task runs once where pools, disruptions and shapes of work meet (issue 24, item 3).

Each feature passes on its own; users get hurt where they meet. A *cell* here is one pool,
one disruption and one shape of work, with real ``celery worker`` processes on the strict
server, and every cell checks the same invariant: every task sent ran exactly once (by
the records the tasks themselves write), none was lost, the workers not killed on purpose
are still alive, and the queues are empty at the end.

- Pools: prefork, threads, gevent, solo.
- Disruptions: a reconnect; a warm shutdown with tasks prefetched (a second worker takes
  what it releases); SIGKILL of one of two workers; an SQS outage longer than the lease;
  deletes slower than the lease.
- Shapes: one queue; two queues; countdowns beyond the parking threshold; bodies through
  S3; one FIFO message group.

The 100 cells of the product part into four *covering sets* of 25
(:func:`covering_set`), in each of which every pair (pool and disruption, pool and
shape, disruption and shape) meets at least once. CI runs every cell on every landing,
each set once, spread over its integration environments so that each Celery/kombu
release meets every pair: ``IT_CROSSINGS`` names the sets to run (``tox.ini``: 5.5 runs
set 0, 5.7 set 1, 5.6 sets 2 and 3). Unset, set 0 runs; ``all`` runs the whole product::

    IT_CROSSINGS=all .venv/bin/python -m pytest tests/integration/test_crossings.py -n 3

Leases and tasks are scaled down (3 s leases, 6 s tasks). Times are failure guards only:
the assertions are counts.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import celery
import pytest

from tests.integration.harness import (
    UNDELAYED,
    Bed,
    Worker,
    assert_queue_empty,
    assert_reconnected,
    no_copy_left,
    reconnected,
    report,
    settle,
    wait_for,
    wait_out_copies,
)
from tests.integration.test_fifo import fifo_queue
from tests.integration.test_fifo import send as send_in_group
from tests.integration.test_large_payloads import LARGE, new_bucket
from tests.integration.test_worker_stops import kill_leftovers, start

LEASE = 3
#: Outlives its first lease: renewed at least once.
LONG = 2 * LEASE
#: Short tasks last long enough that none ends between a worker's receive and its kill:
#: an ack whose delete has not landed when the worker dies is run again, by design
#: (``ack_batch_interval``).
SHORT = 1.0
#: ETAs further away than this are parked; the far countdowns are parked once.
THRESHOLD = 3
COUNTDOWN = 3 * THRESHOLD
OUTAGE = 2 * LEASE + 1
#: The longest any cell's work may take once sent, disruption included: a guard only.
WORK_GUARD = 120

POOLS = ("prefork", "threads", "gevent", "solo")
DISRUPTIONS = ("reconnect", "warm_shutdown", "sigkill", "outage", "slow_deletes")
SHAPES = ("one_queue", "two_queues", "far_countdown", "s3_body", "fifo_group")


@dataclass(frozen=True)
class Cell:
    pool: str
    disruption: str
    shape: str

    def __str__(self) -> str:
        return f"{self.pool}-{self.disruption}-{self.shape}"


def covering_set(number: int = 0) -> list[Cell]:
    """Covering set ``number`` (0 to 3): every pair at least once, in one cell per
    disruption and shape (25).

    The pool of the cell in row ``d`` (disruption) and column ``s`` (shape) is pool
    ``(d + s + number) mod 4``: each row and each column runs through all four pools,
    and the four sets give each (disruption, shape) each pool once, so that together
    they are the whole product.
    """
    return [
        Cell(POOLS[(d + s + number) % len(POOLS)], disruption, shape)
        for (d, disruption), (s, shape) in itertools.product(
            enumerate(DISRUPTIONS), enumerate(SHAPES)
        )
    ]


def every_cell() -> list[Cell]:
    return [Cell(*cell) for cell in itertools.product(POOLS, DISRUPTIONS, SHAPES)]


def chosen_cells(setting: str | None) -> list[Cell]:
    """The cells ``IT_CROSSINGS`` names: ``all``, or covering sets by number
    (``"2,3"``); unset or empty, set 0."""
    if setting == "all":
        return every_cell()
    try:
        numbers = [int(number) for number in (setting or "0").split(",")]
    except ValueError:
        numbers = []
    if not numbers or any(not 0 <= number < len(POOLS) for number in numbers):
        raise ValueError(
            f"IT_CROSSINGS={setting!r}: 'all', or covering set numbers from 0 to "
            f"{len(POOLS) - 1} separated by commas"
        )
    return [cell for number in dict.fromkeys(numbers) for cell in covering_set(number)]


CELLS = chosen_cells(os.environ.get("IT_CROSSINGS"))


def test_the_covering_set_meets_every_pair() -> None:
    cells = covering_set()
    met = {
        pair
        for cell in cells
        for pair in [
            ("pool-disruption", cell.pool, cell.disruption),
            ("pool-shape", cell.pool, cell.shape),
            ("disruption-shape", cell.disruption, cell.shape),
        ]
    }
    wanted = {
        *(("pool-disruption", p, d) for p, d in itertools.product(POOLS, DISRUPTIONS)),
        *(("pool-shape", p, s) for p, s in itertools.product(POOLS, SHAPES)),
        *(("disruption-shape", d, s) for d, s in itertools.product(DISRUPTIONS, SHAPES)),
    }
    assert wanted - met == set()
    assert len(cells) == len(DISRUPTIONS) * len(SHAPES)


def test_the_four_covering_sets_are_the_whole_product_once() -> None:
    sets = [covering_set(number) for number in range(len(POOLS))]
    for cells in sets:
        assert {(c.disruption, c.shape) for c in cells} == set(
            itertools.product(DISRUPTIONS, SHAPES)
        )
        assert {(c.pool, c.disruption) for c in cells} == set(
            itertools.product(POOLS, DISRUPTIONS)
        )
        assert {(c.pool, c.shape) for c in cells} == set(itertools.product(POOLS, SHAPES))
    together = [cell for cells in sets for cell in cells]
    assert sorted(map(str, together)) == sorted(map(str, every_cell()))


def test_it_crossings_names_the_sets_to_run() -> None:
    assert chosen_cells(None) == chosen_cells("") == covering_set(0)
    assert chosen_cells("2,3") == covering_set(2) + covering_set(3)
    assert chosen_cells("all") == every_cell()
    for wrong in ("4", "one", "1,-1"):
        with pytest.raises(ValueError, match="IT_CROSSINGS="):
            chosen_cells(wrong)


def note_outcome(cell: Cell, **figures: int) -> None:
    """With ``IT_CROSSINGS_RESULTS`` set, add the cell's figures to that JSON-lines file:
    the table of a whole run, which ``-n 3`` keeps from the terminal."""
    path = os.environ.get("IT_CROSSINGS_RESULTS")
    if path:
        with open(path, "a") as results:
            results.write(json.dumps({"cell": str(cell), **figures}) + "\n")


@dataclass
class Work:
    """One shape of work: its queues, what the workers need, and how it is sent."""

    beds: list[Bed]
    send: Callable[[], list[str]]
    options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)


def prepare(shape: str, bed: Bed) -> Work:
    """Create the queues of ``shape``; each shape runs long tasks, and something besides."""
    if shape == "fifo_group":
        fifo_queue(bed, visibility_timeout=LEASE)

        def send_group() -> list[str]:
            sent = [send_in_group(bed, "busy", f"g-{n}", LEASE, group="g") for n in range(3)]
            return [task.task_id for task in sent]

        return Work([bed], send_group)
    bed.create_queue(visibility_timeout=LEASE)

    def long_and_short(on: Bed, **producer: Any) -> list[str]:
        return [
            on.send("busy", "long", LONG, **producer),
            on.send("busy", "short", SHORT, **producer),
        ]

    if shape == "two_queues":
        other = dataclasses.replace(bed, queue=f"{bed.queue}-b")
        other.create_queue(visibility_timeout=LEASE)
        return Work(
            [bed, other],
            lambda: [*long_and_short(bed), *long_and_short(other)],
            env={"IT_EXTRA_QUEUE": other.queue},
        )
    if shape == "far_countdown":
        return Work(
            [bed],
            lambda: [
                *long_and_short(bed),
                # Published undelayed: parked at the receive, the path under test.
                *(
                    bed.send("busy", "far", SHORT, countdown=COUNTDOWN, transport_options=UNDELAYED)
                    for _ in range(2)
                ),
            ],
            options={"eta_parking_threshold": THRESHOLD},
        )
    if shape == "s3_body":
        large = {"large_payload_bucket": new_bucket(bed)}
        return Work(
            [bed],
            lambda: (
                [
                    bed.send("busy", "large", LONG, "x" * LARGE, transport_options=large)
                    for _ in range(2)
                ]
                + [bed.send("busy", "short", SHORT, transport_options=large)]
            ),
            options=large,
        )
    return Work([bed], lambda: [*long_and_short(bed), *long_and_short(bed)])


@dataclass
class Run:
    """The workers of one cell, started as its disruption wants them."""

    cell: Cell
    bed: Bed
    work: Work
    stack: ExitStack
    workers: dict[str, Worker] = field(default_factory=dict)
    #: Workers the disruption stopped or killed on purpose.
    stopped: set[str] = field(default_factory=set)

    def start(self, name: str, **env: Any) -> Worker:
        concurrency = 1 if self.cell.pool == "solo" else 2
        process = start(
            self.stack,
            self.bed,
            self.cell.pool,
            concurrency,
            name,
            options={"visibility_timeout": LEASE, **self.work.options},
            IT_PREFETCH_MULTIPLIER=2,
            **{**self.work.env, **env},
        )
        self.workers[name] = process
        return process

    def start_all(self, names: str) -> None:
        for name in names:
            self.start(name)
        for name in names:
            self.workers[name].wait_ready()

    def first_receiver(self) -> str:
        return wait_for(
            lambda: next((n for n, w in self.workers.items() if " received" in w.log), None),
            30,
            "a first receive",
        )


def disrupt(run: Run) -> list[str]:
    """Start the cell's workers, send its work and disrupt them; the task ids sent."""
    disruption, server = run.cell.disruption, run.bed.server
    if disruption == "reconnect":
        run.start("a", IT_DROP_CONNECTION_AFTER=LEASE).wait_ready()
        return run.work.send()
    if disruption == "outage":
        run.start("a").wait_ready()
        sent = run.work.send()
        run.first_receiver()
        server.outage(OUTAGE, "drop_connection")
        return sent
    if disruption == "slow_deletes":
        server.inject_fault("DeleteMessageBatch", "delay", count=3, seconds=LEASE + 1)
        run.start_all("ab")
        return run.work.send()
    if disruption == "warm_shutdown":
        first = run.start("a")
        first.wait_ready()
        sent = run.work.send()
        run.first_receiver()
        run.start("b").wait_ready()
        first.warm_shutdown(60)
        run.stopped.add("a")
        return sent
    assert disruption == "sigkill", disruption
    run.start_all("ab")
    sent = run.work.send()
    name = run.first_receiver()
    victim = run.workers[name]
    run.stack.callback(kill_leftovers, victim.pool_pids())
    victim.kill(signal.SIGKILL)
    run.stopped.add(name)
    return sent


#: Cells that do not hold yet, and why. Skipped, not run as an xfail: each waits out its
#: work guard (156 s in CI) to learn what the strict xfail in test_reconnect.py, which
#: holds the same gap, already tells.
KNOWN_GAPS = {
    "celery 5.5 prefork reconnect": (
        "Celery 5.5 never acks the tasks running in a prefork pool at a reconnect "
        "(test_reconnect.py): their messages stay held until the worker stops"
    ),
}


def known_gap(cell: Cell) -> str | None:
    if cell.disruption != "reconnect":
        return None
    if celery.VERSION < (5, 6) and cell.pool == "prefork":
        return KNOWN_GAPS["celery 5.5 prefork reconnect"]
    return None


@pytest.mark.parametrize("cell", CELLS, ids=str)
def test_every_task_runs_once(cell: Cell, bed: Bed) -> None:
    gap = known_gap(cell)
    if gap is not None:
        pytest.skip(gap)
    work = prepare(cell.shape, bed)
    with ExitStack() as stack:
        run = Run(cell, bed, work, stack)
        sent = disrupt(run)
        bed.wait_for_executions(len(sent), timeout=WORK_GUARD)
        # No copy can come once the queue is drained; one received before may still run.
        drained = all(no_copy_left(queue)["drained"] for queue in work.beds)
        wait_out_copies(bed, len(sent), LONG, work.beds)
        if cell.disruption == "reconnect":
            settle(lambda: reconnected(run.workers["a"].log_path.read_text()))
        alive = {
            name: process.process.poll() is None
            for name, process in run.workers.items()
            if name not in run.stopped
        }
        logs = "".join(process.log_path.read_text() for process in run.workers.values())
    if cell.disruption == "reconnect":
        assert_reconnected(run.workers["a"].log_path.read_text())
    runs = bed.runs_per_task()
    duplicates = sum(count - 1 for count in runs.values() if count > 1)
    lost = [task_id for task_id in sent if task_id not in runs]
    report(f"crossing/{cell}", tasks=len(sent), duplicates=duplicates, lost=len(lost))
    note_outcome(cell, tasks=len(sent), duplicates=duplicates, lost=len(lost))
    assert drained, logs
    assert runs == dict.fromkeys(sent, 1), logs
    assert all(alive.values()), (alive, logs)
    for queue in work.beds:
        assert_queue_empty(queue)
