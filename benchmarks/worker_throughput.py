"""Real Celery workers on a real SQS server: kombu's stock SQS transport against ours.

The simulation (``renewal_requests.py``) counts renewal calls; this one asks what the
heartbeat costs and buys in a real worker: ``celery worker`` subprocesses talking HTTP to
a local SQS server (``celery_sqs_heartbeat.testing.strict_sqs``: moto with SQS's lease
rules, and a count of every SQS call by action). Both transports get the same transport
options, the same queue settings and the same tasks; only ``broker_transport`` differs.

Scenarios, one module each, run in this order whatever order they are asked in:

* ``throughput`` (``scenario_throughput.py``): a no-op backlog, prefork and threads;
* ``long`` (``scenario_long.py``): tasks that outlive the lease;
* ``acks`` (``scenario_acks.py``): what an ack costs, with variants of ours;
* ``receive`` (``scenario_receive.py``): the issue's workload at kombu's defaults.

They share the runner (``bench_workers.py``), the figures of a run (``bench_runs.py``)
and the tables' arithmetic (``bench_report.py``). Runs alternate the transports (stock,
ours, ours, stock, ...) so that drift of the machine hits both sides alike; tables show
the median and, in brackets, the range of the runs.

Usage: ``python benchmarks/worker_throughput.py [--scenario acks] [--smoke] [--quick]
[--markdown report.md] [--json results.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import scenario_acks
import scenario_long
import scenario_receive
import scenario_throughput
from bench_report import utc_stamp
from bench_runs import Plan, Run, parse_setup
from bench_workers import Bench, Scenario

from celery_sqs_heartbeat.testing import StrictSQSServer

SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        scenario_throughput.SCENARIO,
        scenario_long.SCENARIO,
        scenario_acks.SCENARIO,
        scenario_receive.SCENARIO,
    )
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    plan = _plan(args, argv)
    chosen = [SCENARIOS[name] for name in SCENARIOS if name in _scenarios(args)]
    began = time.monotonic()
    measured = _measure(chosen, plan)
    elapsed = time.monotonic() - began
    print(
        f"\n{utc_stamp()}, {os.cpu_count()} CPUs, {elapsed:.0f} s in all; logs in {plan.workdir}\n"
    )
    report = "\n\n".join(
        scenario.section(runs, plan, elapsed) for scenario, runs in measured if runs
    )
    print(report)
    if args.markdown:
        args.markdown.write_text(report + "\n")
    if args.json:
        every = [run for _, runs in measured for run in runs]
        args.json.write_text(json.dumps([asdict(r) for r in every], indent=1))
    failed = [run for scenario, runs in measured for run in runs if scenario.failed(run)]
    if failed:
        print(
            f"\nFAILED: {len(failed)} run(s) did not delete every message or did not run "
            "every task exactly once: " + ", ".join(str(r.order) for r in failed),
            file=sys.stderr,
        )
    return 1 if failed else 0


def _measure(chosen: Sequence[Scenario], plan: Plan) -> list[tuple[Scenario, list[Run]]]:
    """One server for the whole session, so that every scenario meets the same one."""
    measured: list[tuple[Scenario, list[Run]]] = []
    with StrictSQSServer() as server:
        bench = Bench(server, plan.workdir)
        try:
            for scenario in chosen:
                measured.append((scenario, scenario.measure(bench, plan)))
        finally:
            bench.close()
    return measured


def _scenarios(args: argparse.Namespace) -> set[str]:
    scenarios = set(args.scenario or (["acks"] if args.smoke else ["throughput", "long"]))
    if args.skip_throughput:
        scenarios.discard("throughput")
    if args.skip_long:
        scenarios.discard("long")
    return scenarios


def _plan(args: argparse.Namespace, argv: Sequence[str] | None) -> Plan:
    """``--smoke`` and ``--quick`` only pick defaults: a size given explicitly wins."""
    short = args.quick or args.smoke
    ack_setups = ["threads:8"] if args.smoke else scenario_acks.SETUPS
    receive_setups = ["threads:8"] if args.smoke else scenario_receive.SETUPS
    sides = scenario_acks.ack_sides(args.ours_options, args.variant)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sqs-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    command = [_shown_path(sys.executable), _shown_path(__file__), *(argv or sys.argv[1:])]
    return Plan(
        tasks=args.tasks or (30 if args.smoke else 100 if args.quick else 300),
        reps=args.runs or (1 if short else 2),
        long_reps=args.long_reps or (1 if short else 2),
        window=args.long_window or (40.0 if short else 50.0),
        latencies=args.latency or ([0.0] if args.smoke else list(scenario_acks.LATENCIES)),
        ack_setups=args.setups or [parse_setup(s) for s in ack_setups],
        receive_setups=args.setups or [parse_setup(s) for s in receive_setups],
        sides=sides,
        task_seconds=args.task_seconds,
        idle=args.idle or (2.0 if args.smoke else scenario_receive.IDLE),
        probes=args.probes if args.probes is not None else (5 if args.smoke else 0),
        workdir=workdir,
        command=shlex.join(command),
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _add_sizes(parser)
    _add_cells(parser)
    parser.add_argument(
        "--task-seconds",
        type=float,
        help="receive: each task sleeps this long instead of doing nothing",
    )
    parser.add_argument(
        "--idle",
        type=float,
        help=f"receive: seconds the worker sits idle after the backlog ({scenario_receive.IDLE:g})",
    )
    parser.add_argument(
        "--probes",
        type=int,
        help="receive: tasks sent one at a time to the idle worker for publish-to-start "
        "latency (0; 5 with --smoke)",
    )
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-long", action="store_true")
    parser.add_argument("--json", type=Path, help="also write every run's raw figures here")
    parser.add_argument("--markdown", type=Path, help="also write the report here")
    parser.add_argument("--workdir", type=Path, help="worker logs and record files (temp dir)")
    return parser


def _add_sizes(parser: argparse.ArgumentParser) -> None:
    """What runs, and how much of it: shared by every scenario."""
    parser.add_argument(
        "--scenario",
        action="append",
        choices=tuple(SCENARIOS),
        help="repeatable; default: throughput and long (acks with --smoke)",
    )
    parser.add_argument("--quick", action="store_true", help="one run each, smaller loads")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="acks (or the scenario given) in under a minute, for CI: 30 tasks, 1 run, "
        "threads:8, latency 0",
    )
    parser.add_argument("--tasks", type=int, help="no-op tasks per throughput/acks run (300)")
    parser.add_argument(
        "--runs", "--reps", dest="runs", type=int, help="runs per transport and cell (2)"
    )
    parser.add_argument("--long-reps", type=int, help="long-task runs per transport (2)")
    parser.add_argument("--long-window", type=float, help="seconds a long-task worker runs (50)")


def _add_cells(parser: argparse.ArgumentParser) -> None:
    """The cells and sides of the acks and receive scenarios."""
    parser.add_argument(
        "--latency", type=float, nargs="+", help="acks: seconds added to every SQS call (0 0.015)"
    )
    parser.add_argument(
        "--setups",
        type=parse_setup,
        nargs="+",
        metavar="POOL:N",
        help=f"acks and receive: worker pools ({' '.join(scenario_acks.SETUPS)}; receive: "
        f"{' '.join(scenario_receive.SETUPS)})",
    )
    parser.add_argument(
        "--ours-options",
        type=scenario_acks.parse_json_object,
        default={},
        metavar="JSON",
        help="acks: transport options for ours only, e.g. '{\"ack_batch_interval\": 0.1}'",
    )
    parser.add_argument(
        "--variant",
        type=scenario_acks.parse_variant,
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="acks: another side of ours with these options added (repeatable)",
    )


def _shown_path(path: str) -> str:
    """Relative to the working directory when under it, so a command can be pasted back."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


if __name__ == "__main__":
    sys.exit(main())
