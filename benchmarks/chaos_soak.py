"""The chaos soak (issue 33): for each pool, three real ``celery worker`` processes on the
strict SQS server for a set time, while a producer sends tasks of every shape and a seeded
driver does what production does to them; then the checks, per pool.

    .venv/bin/python benchmarks/chaos_soak.py --minutes 30 --seed 1    # every pool
    .venv/bin/python benchmarks/chaos_soak.py --pools threads --minutes 1

Shapes: short; longer than the lease; a countdown beyond the parking threshold (parked);
a body through S3; a FIFO group; one that fails twice, released with a backoff; one that
retries. Disruptions: SIGTERM (SIGKILL after a 20 s grace) and SIGKILL of workers, and
their restarts; a worker's broker connection dropped; throttling and 5xx windows on the
workers' calls, 3 % of them failing all along; slow and failing deletes; an outage of
every SQS call longer than the lease; ``celery events --dump`` started and killed.

Checks, per pool: every task published ran to completion and nothing is left in a queue
or in flight; every second run is explained (its first worker was SIGKILLed or cut off
by an outage longer than the lease); no FIFO group ran out of order; after
``celery sqs-reap --delete``, no queue, subscription, topic or S3 object is left but the
task queues, the workers' mailboxes and kombu's two topics; the memory of each worker that
lived through the run, at the end, within a margin of its size after its warm-up (five
lost connections before the chaos, and 30 s). Exit status 1 if a check failed.

Everything a run did is kept under ``--workdir``: per pool, the plan, the driver's log,
the tasks' records, the workers' and monitors' logs and the reaper's output.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from soak_evidence import chaos_of, json_lines, published, runs_and_receipts
from soak_report import PoolResult, details, summary, table
from soak_run import SoakSettings, run_pool
from soak_verdicts import judge

POOLS = ("prefork", "threads", "gevent", "solo")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.judge:
        return judge_kept(Path(args.judge))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="chaos-soak-"))
    settings = SoakSettings(minutes=args.minutes, seed=args.seed, workdir=workdir, rate=args.rate)
    print(f"chaos soak: seed {args.seed}, {args.minutes} min per pool, logs in {workdir}")
    results: list[PoolResult] = []
    for pool in args.pools:
        began = time.monotonic()
        result = run_pool(pool, settings)
        results.append(result)
        verdict = "pass" if result.passed else "FAIL"
        print(f"{pool}: {verdict} in {time.monotonic() - began:.0f} s; {summary(result)}")
        for line in details(result):
            print(f"  {line}")
        sys.stdout.flush()
    print()
    print(table(results))
    return 0 if all(result.passed for result in results) else 1


def judge_kept(workdir: Path) -> int:
    """Judge the tasks of a finished run again from what it kept, pool by pool: the
    verdicts of a run made before a change to them (leftovers and memory are not kept)."""
    settings = SoakSettings(minutes=0, seed=0, workdir=workdir)
    failed = False
    for pool_dir in sorted(p for p in workdir.iterdir() if (p / "published.jsonl").exists()):
        runs, receipts = runs_and_receipts(pool_dir / "records.jsonl")
        acts = json_lines(pool_dir / "driver.jsonl")
        tally = judge(
            published(pool_dir / "published.jsonl"),
            runs,
            receipts,
            chaos_of(acts, SoakSettings.lease, settings.receive_slack, pool_dir.name),
        )
        twice = ", ".join(f"{why} {n}" for why, n in sorted(tally.duplicates_by_reason().items()))
        print(
            f"{pool_dir.name}: {tally.published} tasks, {tally.runs} runs, {tally.ran_once} ran "
            f"once, ran twice: {twice or 'none'}, lost {len(tally.lost)}, out of order "
            f"{len(tally.out_of_order)}"
        )
        for extra in tally.unexplained:
            print(
                f"  unexplained second run: {extra.task_id} ({extra.shape}) on {extra.run.worker}"
            )
        failed = failed or bool(tally.lost or tally.unexplained or tally.out_of_order)
    return 1 if failed else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", nargs="+", choices=POOLS, default=list(POOLS))
    parser.add_argument(
        "--minutes", type=float, default=1.0, help="the chaos's length per pool (default 1)"
    )
    parser.add_argument("--seed", type=int, default=1, help="the schedule's seed (default 1)")
    parser.add_argument(
        "--rate", type=float, default=1.0, help="tasks published a second (default 1)"
    )
    parser.add_argument("--workdir", help="where the logs go (default: a new temporary folder)")
    parser.add_argument(
        "--judge",
        metavar="DIR",
        help="run nothing: judge the tasks of a finished run again from the --workdir it kept",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
