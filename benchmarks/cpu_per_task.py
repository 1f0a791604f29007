"""Worker CPU per no-op task: Celery on a local Redis, this transport and kombu's stock SQS.

One ``celery worker -P prefork -c 4`` per run drains a backlog of no-op tasks; its CPU
(user + system, from ``/proc``, of the main process and of each pool child) is read
when the load is let in and again when the last task is acked, and divided by the tasks.
The same worker is then left idle for as long as the load took and read a third time,
so that the table can show what polling an empty queue costs over the same span.

The backlog is published before the worker starts, for every side: published after,
the SQS sides would be fed no faster than one producer can send to the local server
and would measure a trickle rather than a backlog. Nothing is received before the
first reading: the worker holds in Celery's ``worker_ready`` signal, sent after the
consumer is set up and before its event loop first runs (``bench_app.py``), until it is
let in, and reads its own counters then.

Both SQS sides talk to the project's strict server (``worker_throughput.py``'s runner
and options: ``wait_time_seconds`` 1, lease 30 s); Redis is a ``redis-server`` of the
machine's, started on 127.0.0.1 with persistence off. Runs alternate the sides (redis,
ours, stock, stock, ours, redis, ...) so that a drift of the machine hits each alike.

With ``--profile DIR`` every worker is sampled by ``py-spy record --subprocesses`` from
the release to the last ack (raw stacks in DIR, one file per run; read them with
``cpu_profile.py``): the sampler slows the worker down, so profiled runs are for shares,
not for the CPU table.

    python benchmarks/cpu_per_task.py   # --runs N, --tasks N, --sides S ..., --profile DIR, --smoke
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bench_report import environment
from bench_runs import OURS, STOCK, Setup, Side, alternate
from bench_workers import Bench, _worker
from cpu_brokers import REDIS, Broker, RedisBroker, SqsBroker, local_redis
from cpu_table import CpuRun, cpu_table
from proc_cpu import tree_cpu

from celery_sqs_heartbeat.testing import StrictSQSServer

SETUP = Setup("prefork -c 4", "prefork", 4)
SIDES = {side.label: side for side in (REDIS, OURS, STOCK)}
#: How long the worker may take to drain a backlog: a failure guard, not a measure.
DRAIN_TIMEOUT = 300.0


@dataclass(frozen=True)
class Options:
    tasks: int
    sides: list[Side]
    runs: int
    workdir: Path
    profile: Path | None


def run_once(broker: Broker, order: int, options: Options) -> CpuRun:
    """Publish, start a held worker, let it in, read its CPU at the last ack and after
    as long again idle, and count the executions."""
    queue, published = broker.publish(options.tasks)
    records = options.workdir / f"{queue}.jsonl"
    gate = options.workdir / queue
    env = {**broker.env(queue, records), "BENCH_CPU_GATE": str(gate)}
    with _worker(env, SETUP, options.workdir / f"{queue}.log") as worker:
        pid = worker.process.pid
        _wait_for_file(Path(f"{gate}.held"), worker.process)
        profiler = _profiler(pid, options.profile, f"{order:02d}-{broker.side.label}")
        released = time.monotonic()
        Path(f"{gate}.go").touch()
        start = _read_start(Path(f"{gate}.cpu"), worker.process)
        _wait_drained(broker, queue, records, options.tasks)
        end = tree_cpu(pid)
        window = time.monotonic() - released
        if profiler is not None:
            _stop(profiler)
        time.sleep(window)
        idle = tree_cpu(pid)
        worker.stop()
    executions = Counter(json.loads(line)["task_id"] for line in records.read_text().splitlines())
    return CpuRun(
        side=broker.side.label,
        order=order,
        tasks=options.tasks,
        window=window,
        busy_main=end[pid] - start[pid],
        busy_pool=_pool_seconds(start, end, pid),
        idle_main=idle[pid] - end[pid],
        idle_pool=_pool_seconds(end, idle, pid),
        exactly_once=set(executions) == published and set(executions.values()) == {1},
        profiled=profiler is not None,
    )


def _pool_seconds(before: dict[int, float], after: dict[int, float], main: int) -> float:
    """The pool children's CPU between two readings; a child not in both (one that was
    replaced) counts from zero, so that its successor's CPU is not lost."""
    return sum(after[pid] - before.get(pid, 0.0) for pid in after if pid != main)


def _wait_for_file(path: Path, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise RuntimeError(f"worker exited before {path.name}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {path.name} after {timeout} s")
        time.sleep(0.01)


def _read_start(path: Path, process: subprocess.Popen[bytes]) -> dict[int, float]:
    _wait_for_file(path, process)
    while not (text := path.read_text()):  # written, not yet flushed
        time.sleep(0.001)
    return {int(pid): seconds for pid, seconds in json.loads(text).items()}


def _wait_drained(broker: Broker, queue: str, records: Path, count: int) -> None:
    """Every task run and acked. The record file is read first, as it costs the worker
    nothing; the broker is asked only once every task has run."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while time.monotonic() < deadline:
        ran = len(records.read_text().splitlines()) if records.exists() else 0
        if ran >= count and broker.drained(queue, count):
            return
        time.sleep(0.02)
    raise RuntimeError(f"{queue} not drained in {DRAIN_TIMEOUT} s")


def _profiler(pid: int, directory: Path | None, name: str) -> subprocess.Popen[bytes] | None:
    """``py-spy record`` on the worker and its pool, started while the worker is held;
    returns once it samples."""
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / f"{name}.log"
    command = [_py_spy(), "record", "--pid", str(pid), "--subprocesses", "--full-filenames"]
    command += ["--gil", "--format", "raw", "--rate", "200", "-o", str(directory / f"{name}.txt")]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while "Sampling process" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"py-spy did not start; see {log}")
        time.sleep(0.05)
    time.sleep(1.0)  # it finds the pool's children on its next scan
    return process


def _py_spy() -> str:
    """The one installed beside this interpreter (the ``bench`` extra), else PATH's."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy") or "py-spy"


def _stop(profiler: subprocess.Popen[bytes]) -> None:
    """py-spy writes its stacks when interrupted, as after Ctrl-C."""
    profiler.send_signal(signal.SIGINT)
    profiler.wait(60)


def measure(options: Options) -> list[CpuRun]:
    """Redis is only started, and redis-py only imported, when a side needs it."""
    runs: list[CpuRun] = []
    with ExitStack() as stack:
        server = stack.enter_context(StrictSQSServer())
        bench = Bench(server, options.workdir)
        stack.callback(bench.close)
        brokers: dict[str, Broker] = {
            OURS.label: SqsBroker(bench, OURS),
            STOCK.label: SqsBroker(bench, STOCK),
        }
        if REDIS in options.sides:
            redis = RedisBroker(stack.enter_context(local_redis(options.workdir)))
            stack.callback(redis.close)
            brokers[REDIS.label] = redis
        for order, side in enumerate(alternate(options.sides, options.runs), 1):
            run = run_once(brokers[side.label], order, options)
            print(run.progress(), file=sys.stderr, flush=True)
            runs.append(run)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options = Options(
        tasks=args.tasks or (20 if args.smoke else 400),
        sides=[SIDES[label] for label in args.sides],
        runs=args.runs or (1 if args.smoke else 3),
        workdir=args.workdir or Path(tempfile.mkdtemp(prefix="sqs-cpu-")),
        profile=args.profile,
    )
    options.workdir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    runs = measure(options)
    given = list(argv) if argv is not None else sys.argv[1:]
    command = " ".join(["python benchmarks/cpu_per_task.py", *given])
    print(f"Worker CPU per no-op task, {SETUP.label}, {options.tasks} tasks per run\n")
    print(cpu_table(runs))
    print()
    print(environment(command, time.monotonic() - began))
    failed = [run.order for run in runs if not run.exactly_once]
    if failed:
        print(f"FAILED: runs {failed} did not run every task exactly once", file=sys.stderr)
    return 1 if failed else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, help="no-op tasks per run (400; 20 with --smoke)")
    parser.add_argument("--runs", type=int, help="runs per side (3; 1 with --smoke)")
    parser.add_argument(
        "--sides", nargs="+", choices=tuple(SIDES), default=list(SIDES), help="redis ours stock"
    )
    parser.add_argument("--profile", type=Path, help="py-spy every worker; raw stacks here")
    parser.add_argument("--smoke", action="store_true", help="one small run per side, for CI")
    parser.add_argument("--workdir", type=Path, help="worker logs and record files (temp dir)")
    return parser


if __name__ == "__main__":
    sys.exit(main())
