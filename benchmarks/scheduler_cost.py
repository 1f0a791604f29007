"""What a renewal check costs the lock that acks and receives wait for, by leases held.

Measures ``celery_sqs_heartbeat.leasing.book.LeaseBook`` side by side with the book of an
earlier commit (``--baseline``, by default the last one that scanned every lease on each
check), alternating the two in one run:

- *idle check*: ``take_exhausted`` and ``due_batches`` when nothing is due, what the
  renewal thread does every interval most of the time;
- *renewal check*: the same with ``due`` leases due, plus settling SQS's answer;
- *longest lock hold* of a check renewing ``due`` leases (1,000 and 10,000): the
  manager holds its lock for each chunk it takes (``due_batches`` with a limit of
  ``BATCHES_PER_HOLD`` calls, ``take_exhausted``, ``has_due``) and for each answer it
  settles; a book without ``limit`` (the baseline) is taken in one hold, as its manager did;
- *ack*: ``end`` of one lease;
- *memory*: bytes per lease held, receipt handle (400 characters) included.

Leases are received evenly over one threshold's worth of time, so some are always
close to due, as in a busy worker. Medians of repeated runs; run it on an idle machine.

    python benchmarks/scheduler_cost.py                 # 1k, 10k and 120k leases
    python benchmarks/scheduler_cost.py --smoke         # seconds: keeps the script working
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from celery_sqs_heartbeat.leasing import book, leases, schedule  # noqa: E402

#: This tree's book and the records and constants it is driven with, under the names the
#: baseline's one ``leases`` module had them.
current = SimpleNamespace(**{**vars(leases), **vars(schedule), "LeaseBook": book.LeaseBook})

#: The last commit whose LeaseBook scanned and sorted every lease on each check.
DEFAULT_BASELINE = "c1da785"
VISIBILITY_TIMEOUT = 30
THRESHOLD = 10.0
HANDLE = "A" * 400


def load_baseline(revision: str) -> ModuleType:
    """The ``leases`` module as it was at ``revision`` (it imports only the stdlib)."""
    source = subprocess.run(
        ["git", "show", f"{revision}:celery_sqs_heartbeat/leases.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_leases.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_leases", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_leases"] = module
    spec.loader.exec_module(module)
    return module


def make_book(module: ModuleType, count: int) -> tuple[Any, list[Any]]:
    policy = module.LeasePolicy(visibility_timeout=VISIBILITY_TIMEOUT, threshold=THRESHOLD)
    book = module.LeaseBook()
    leases = []
    for n in range(count):
        lease = module.Lease(
            receipt_handle=HANDLE + str(n),
            queue="jobs",
            policy=policy,
            received_at=THRESHOLD * n / count,
            task_id=f"task-{n}",
            task_name="tasks.crunch",
        )
        book.add(lease)
        leases.append(lease)
    return book, leases


#: When the first lease of a book comes due.
FIRST_DUE = VISIBILITY_TIMEOUT - THRESHOLD


def idle_check(module: ModuleType, count: int) -> Callable[[], None]:
    book, _ = make_book(module, count)
    now = FIRST_DUE - 0.5

    def run() -> None:
        book.take_exhausted(now)
        book.due_batches(now)

    return run


def renewal_check(module: ModuleType, count: int, due: int) -> Callable[[], float]:
    """A fresh book each time (a renewal changes it); returns the seconds of the check."""

    def run() -> float:
        book, _ = make_book(module, count)
        now = FIRST_DUE + THRESHOLD * (due - 0.5) / count
        started = time.perf_counter()
        book.take_exhausted(now)
        batches = book.due_batches(now)
        for batch in batches:
            answer = {lease: (module.EntryResult.OK, "") for lease, _ in batch.entries}
            book.settle(batch, answer, now)
        return time.perf_counter() - started

    return run


def longest_hold(module: ModuleType, count: int, due: int) -> float:
    """The longest single hold of the lock in a check renewing ``due`` of ``count`` leases.

    Counted in the thread's CPU time with the garbage collector off: a preemption by
    another process, or a collection, stops the thread whether it holds the lock or not,
    and would measure the machine or the whole heap rather than the book.
    """
    from celery_sqs_heartbeat.leasing.call_starter import BATCHES_PER_HOLD

    gc.disable()
    try:
        return _longest_hold(module, count, due, BATCHES_PER_HOLD)
    finally:
        gc.enable()


def _longest_hold(module: ModuleType, count: int, due: int, batches_per_hold: int) -> float:
    book, _ = make_book(module, count)
    now = FIRST_DUE + THRESHOLD * (due - 0.5) / count
    chunked = hasattr(book, "has_due")
    holds, batches, more = [], [], True
    while more:
        started = time.thread_time()
        if chunked:
            taken = book.due_batches(now, limit=batches_per_hold)
            book.take_exhausted(now, limit=batches_per_hold * module.LOOKS_PER_BATCH)
            more = book.has_due(now)
        else:
            book.take_exhausted(now)
            taken = book.due_batches(now)
            more = False
        holds.append(time.thread_time() - started)
        batches.extend(taken)
    for batch in batches:
        answer = {lease: (module.EntryResult.OK, "") for lease, _ in batch.entries}
        started = time.thread_time()
        book.settle(batch, answer, now)
        holds.append(time.thread_time() - started)
    return max(holds)


def ack_cost(module: ModuleType, count: int, acks: int = 1000) -> float:
    book, leases = make_book(module, count)
    chosen = leases[:: max(1, count // acks)][:acks]
    started = time.perf_counter()
    for lease in chosen:
        book.end(lease)
    return (time.perf_counter() - started) / len(chosen)


def bytes_per_lease(module: ModuleType, count: int) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    book, leases = make_book(module, count)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del book, leases
    return (after - before) / count


def median_seconds(run: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(
    modules: dict[str, ModuleType],
    sizes: list[int],
    due: list[int],
    hold_due: list[int],
    repeats: int,
):
    rows = []
    for count in sizes:
        idle = {name: idle_check(module, count) for name, module in modules.items()}
        idle_times: dict[str, list[float]] = {name: [] for name in modules}
        for _ in range(repeats):  # alternated, so both see the same machine
            for name, run in idle.items():
                idle_times[name].append(median_seconds(run, 1))
        row: dict[str, Any] = {"leases": count}
        for name in modules:
            row[f"idle {name}"] = statistics.median(idle_times[name])
        for k in due:
            if k > count:
                continue
            checks = {name: renewal_check(module, count, k) for name, module in modules.items()}
            check_times: dict[str, list[float]] = {name: [] for name in modules}
            for _ in range(max(3, repeats // 3)):
                for name, run in checks.items():
                    check_times[name].append(run())
            for name in modules:
                row[f"{k} due {name}"] = statistics.median(check_times[name])
        for k in hold_due:
            if k > count:
                continue
            hold_times: dict[str, list[float]] = {name: [] for name in modules}
            for _ in range(max(3, repeats // 3)):
                for name, module in modules.items():
                    hold_times[name].append(longest_hold(module, count, k))
            for name in modules:
                row[f"{k} hold {name}"] = statistics.median(hold_times[name])
        for name, module in modules.items():
            row[f"ack {name}"] = ack_cost(module, count)
            row[f"bytes {name}"] = bytes_per_lease(module, count)
        rows.append(row)
    return rows


def markdown(
    rows: list[dict[str, Any]], names: list[str], due: list[int], hold_due: list[int]
) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.3f} ms"

    head = ["leases", "what", *names]
    if len(names) == 2:
        head.append("speed-up")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        measures = [("idle check", "idle", ms)]
        measures += [(f"check renewing {k} due", f"{k} due", ms) for k in due]
        measures += [
            (f"longest lock hold, check renewing {k:,} due", f"{k} hold", ms) for k in hold_due
        ]
        measures += [("one ack (end)", "ack", lambda v: "-" if v is None else f"{v * 1e6:.2f} µs")]
        measures += [("bytes per lease", "bytes", lambda v: "-" if v is None else f"{v:.0f}")]
        for label, key, fmt in measures:
            values = [row.get(f"{key} {name}") for name in names]
            if all(v is None for v in values):
                continue
            cells = [f"{row['leases']:,}", label, *(fmt(v) for v in values)]
            if len(names) == 2:
                base, new = values
                cells.append(_ratio(base / new) if base and new and key != "bytes" else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio(value: float) -> str:
    return f"{value:,.0f}x" if value >= 10 else f"{value:.2g}x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision, or 'none'")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds")
    args = parser.parse_args(argv)
    sizes, due, hold_due, repeats = (
        ([1_000, 2_000], [10], [], 3)
        if args.smoke
        else (
            [1_000, 10_000, 120_000],
            [10, 1_000],
            [1_000, 10_000],
            15,
        )
    )
    modules = {}
    if args.baseline != "none":
        modules[f"before ({args.baseline})"] = load_baseline(args.baseline)
    modules["heap (this tree)"] = current
    rows = measure(modules, sizes, due, hold_due, repeats)
    print(markdown(rows, list(modules), due, hold_due))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
