"""The samples of ``cpu_per_task.py --profile`` broken down by package, main process and
pool apart.

py-spy's raw format is one line per distinct stack: ``frame;frame;... COUNT``, root
first, where ``--subprocesses`` puts a ``process PID:"command"`` frame per process
level (one for the worker's main process, two for a pool child) and every other frame
reads ``function (file:line)``. Idle threads are not sampled, so samples stand for CPU.

Two breakdowns per process: ``self``, by the package of the innermost frame (the code
that was running); ``owner``, by the innermost frame that is not the standard library,
so that ``http.client`` or ``ssl`` called by urllib3 counts as botocore's and ``json``
called by kombu as kombu's. ``through this package`` counts the stacks that pass through
this package at any depth: what it drives, botocore's calls included.

    python benchmarks/cpu_profile.py DIR [--top N]     # DIR: the raw files of --profile
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Where a frame's file lives, first match wins; a file in none of them is the standard
#: library (or the interpreter's frozen modules).
PACKAGES = (
    ("this package", re.compile(r"/celery_sqs_heartbeat/")),
    ("the task (bench_app)", re.compile(r"/benchmarks/")),
    ("Celery (celery, billiard, vine, click)", re.compile(r"/(celery|billiard|vine|click)/")),
    ("kombu (kombu, amqp)", re.compile(r"/(kombu|amqp)/")),
    ("botocore, boto3, urllib3", re.compile(r"/(botocore|boto3|urllib3|s3transfer|jmespath)/")),
    ("redis-py", re.compile(r"/redis/")),
    ("other site-packages", re.compile(r"/(site|dist)-packages/")),
)
STDLIB = "Python stdlib"
OURS = PACKAGES[0][0]
FRAME = re.compile(r"^(?P<function>.*) \((?P<path>.*):(?P<line>\d+)\)$")


@dataclass
class Breakdown:
    """Samples of one kind of process (main or pool), by package."""

    total: int = 0
    own: Counter[str] = field(default_factory=Counter)
    owner: Counter[str] = field(default_factory=Counter)
    through_ours: int = 0
    #: Inclusive samples of each function of this package, and self samples of every leaf.
    ours_inclusive: Counter[str] = field(default_factory=Counter)
    leaves: Counter[str] = field(default_factory=Counter)


def package_of(path: str) -> str:
    for name, pattern in PACKAGES:
        if pattern.search(path):
            return name
    return STDLIB


def parse_line(line: str) -> tuple[int, list[tuple[str, str]], int]:
    """Process depth (1: main, 2: pool child), the frames as (function, path) root
    first, and the sample count."""
    stack, _, count = line.rstrip("\n").rpartition(" ")
    depth = 0
    frames = []
    for frame in stack.split(";"):
        if frame.startswith("process "):
            depth += 1
            continue
        match = FRAME.match(frame)
        frames.append((match["function"], match["path"]) if match else (frame, ""))
    return depth, frames, int(count)


def add_stack(into: Breakdown, frames: Sequence[tuple[str, str]], count: int) -> None:
    packages = [package_of(path) for _, path in frames]
    into.total += count
    if not frames:
        into.own[STDLIB] += count
        into.owner[STDLIB] += count
        return
    into.own[packages[-1]] += count
    into.owner[next((p for p in reversed(packages) if p != STDLIB), STDLIB)] += count
    function, path = frames[-1]
    into.leaves[f"{function} ({_short(path)})"] += count
    ours = {
        f"{f} ({_short(p)})" for (f, p), pkg in zip(frames, packages, strict=True) if pkg == OURS
    }
    if ours:
        into.through_ours += count
    for name in ours:
        into.ours_inclusive[name] += count


def breakdown(lines: Iterable[str]) -> dict[str, Breakdown]:
    kinds = {"main": Breakdown(), "pool": Breakdown()}
    for line in lines:
        if line.strip():
            depth, frames, count = parse_line(line)
            add_stack(kinds["main" if depth <= 1 else "pool"], frames, count)
    return kinds


def _short(path: str) -> str:
    """From the package down: ``kombu/transport/SQS.py``, not the virtualenv's path."""
    for marker in ("site-packages/", "/celery_sqs_heartbeat/", "/benchmarks/", "/lib/python3"):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return ("celery_sqs_heartbeat/" + tail) if "heartbeat" in marker else tail
    return path


def shares_table(kinds: dict[str, Breakdown]) -> str:
    names = [name for name, _ in PACKAGES] + [STDLIB]
    lines = [
        "| package | main: self | main: owner | pool: self | pool: owner | all: owner |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    main, pool = kinds["main"], kinds["pool"]
    every = main.total + pool.total
    for name in names:
        cells = [
            _pct(main.own[name], main.total),
            _pct(main.owner[name], main.total),
            _pct(pool.own[name], pool.total),
            _pct(pool.owner[name], pool.total),
            _pct(main.owner[name] + pool.owner[name], every),
        ]
        if any(cell != "0%" for cell in cells):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append(
        f"| samples | {main.total} | | {pool.total} | | {every} |\n"
        f"| stacks through this package | {_pct(main.through_ours, main.total)} | "
        f"| {_pct(pool.through_ours, pool.total)} | | "
        f"{_pct(main.through_ours + pool.through_ours, every)} |"
    )
    return "\n".join(lines)


def top(counter: Counter[str], total: int, n: int) -> str:
    return "\n".join(f"- {_pct(k, total)} {name}" for name, k in counter.most_common(n))


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--side", default="ours", help="the runs of this side (ours)")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    files = sorted(args.directory.glob(f"*-{args.side}.txt"))
    if not files:
        print(f"no *-{args.side}.txt in {args.directory}", file=sys.stderr)
        return 1
    kinds = breakdown(line for path in files for line in path.read_text().splitlines())
    print(f"{len(files)} profile(s) of {args.side}: {', '.join(p.name for p in files)}\n")
    print(shares_table(kinds))
    main_kind = kinds["main"]
    print(f"\nThis package's functions, main process, inclusive (top {args.top}):")
    print(top(main_kind.ours_inclusive, main_kind.total, args.top))
    print(f"\nLeaf functions, main process (top {args.top}):")
    print(top(main_kind.leaves, main_kind.total, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
