"""The reaper's policies of docs/iam.md, as published, on a server that enforces IAM.

A live monitored worker, a SIGKILLed ``celery events`` and a SIGKILLed worker; the
reaper runs with the dry run's policy, then ``--delete`` with it alone (every delete
refused), then with both documents.
"""

from __future__ import annotations

import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from celery_sqs_heartbeat.testing import Refusal, StrictSQSServer
from tests.integration.harness import Bed, create_queue, needs_sns_fanout, wait_for
from tests.integration.iam import Iam, Keys, allow, client, published_policy, recorded
from tests.integration.test_iam_policy import worker_env
from tests.integration.test_monitoring import (
    OPTIONS,
    Process,
    monitored_worker,
    run_celery,
    start_worker,
)
from tests.integration.test_reaper import REAP, STALE, event_queues, queue_names, subscriptions

IAM_RECORDING = True


@dataclass(frozen=True)
class Enforced:
    server: StrictSQSServer
    monitored_worker: Keys
    monitor: Keys
    dry_run: Keys
    reaper: Keys
    ops: Keys

    def refused(self, keys: Keys) -> list[Refusal]:
        return [r for r in self.server.refused_calls() if r["access_key_id"] == keys[0]]

    def actions_used(self, keys: Keys) -> set[str]:
        """Each action ``keys`` called, as IAM names it (``sqs:ListQueues``)."""
        calls = recorded(self.server)
        return {f"{c.service}:{c.action}" for c in calls if c.access_key_id == keys[0]}


def policy_actions(*roles: str) -> set[str]:
    """The actions the published documents of ``roles`` grant."""
    return {
        action
        for role in roles
        for statement in published_policy(role)["Statement"]
        for action in (
            [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
        )
    }


def iam_setup(iam: Iam) -> Enforced:
    monitoring = published_policy("monitoring")
    dry_run = published_policy("reaper-dry-run")
    return Enforced(
        server=iam.server,
        monitored_worker=iam.user("monitored-worker", published_policy("worker"), monitoring),
        monitor=iam.user("monitor", monitoring),
        dry_run=iam.user("reaper-dry-run", dry_run),
        reaper=iam.user("reaper", dry_run, published_policy("reaper-delete")),
        ops=iam.user("ops", allow(["sqs:*", "sns:*"], "*")),
    )


def reap(bed: Bed, enforced: Enforced, keys: Keys, *args: str) -> tuple[int, set[str], str]:
    """``celery sqs-reap`` with ``keys``: its status, its ``action kind name`` lines, output."""
    done = run_celery(bed, *REAP, *args, options=OPTIONS, timeout=120, **worker_env(enforced, keys))
    lines = {" ".join(line.split("\t")[:3]) for line in done.stdout.splitlines() if "\t" in line}
    return done.returncode, lines, done.stdout + done.stderr


@needs_sns_fanout
def test_the_reapers_policies_list_then_delete_only_with_the_delete_statements(
    enforced: Enforced, tmp_path: Path
) -> None:
    bed = Bed(enforced.server, f"celery-it-{uuid.uuid4().hex[:8]}", tmp_path / "x.jsonl", tmp_path)
    sqs, sns = (client(enforced.server, service, enforced.ops) for service in ("sqs", "sns"))
    create_queue(sqs, bed.queue, 30)
    name = f"iam{uuid.uuid4().hex[:6]}"
    with monitored_worker(bed, name, **worker_env(enforced, enforced.monitored_worker)):
        gone = start_worker(
            bed,
            f"gone{name}",
            "-P",
            "solo",
            "--without-heartbeat",
            options=OPTIONS,
            **worker_env(enforced, enforced.monitored_worker),
        )
        dump = Process(
            bed,
            "events-killed",
            "events",
            "--dump",
            options=OPTIONS,
            **worker_env(enforced, enforced.monitor),
        )
        wait_for(lambda: len(event_queues(sns, "")) == 1, 60, "the dump's event queue")
        (event_queue,) = event_queues(sns, "")
        dump.stop(signal.SIGKILL)
        gone.stop(signal.SIGKILL)
        mailbox = next(q for q in queue_names(sqs, "") if q.startswith(f"gone{name}_"))
        left = {event_queue, mailbox}
        arns = {arn for arn, queue in subscriptions(sns, "").items() if queue in left}
        time.sleep(STALE + 4)

        listed = reap(bed, enforced, enforced.dry_run)
        refused_to_list = enforced.refused(enforced.dry_run)
        refused = reap(bed, enforced, enforced.dry_run, "--delete")
        refused_to_delete = enforced.refused(enforced.dry_run)
        queues_after_refusal = queue_names(sqs, "")
        deleted = reap(bed, enforced, enforced.reaper, "--delete")
        queues_after = queue_names(sqs, "")

    names = {f"event-queue {event_queue}", f"mailbox {mailbox}"} | {
        f"subscription {arn}" for arn in arns
    }
    assert len(arns) == 2, arns
    assert listed[:2] == (1, {f"would-delete {n}" for n in names}), listed[2]
    assert refused_to_list == [], refused_to_list
    # Every action granted was used: sns:TagResource is asked by AWS only, not by moto.
    unchecked = {"sns:TagResource"}
    assert enforced.actions_used(enforced.dry_run) == policy_actions("reaper-dry-run") - unchecked
    assert enforced.actions_used(enforced.reaper) == (
        policy_actions("reaper-dry-run", "reaper-delete") - unchecked
    )
    # Each queue's delete refused; their subscriptions are kept, their queues still there.
    assert {(r["action"], r["code"]) for r in refused_to_delete} == {
        ("DeleteQueue", "AccessDenied")
    }
    assert refused[0] == 3, refused[2]
    assert {line.split(" ")[0] for line in refused[1]} == {"failed", "still-there"}, refused[2]
    assert left <= queues_after_refusal, queues_after_refusal
    assert deleted[:2] == (0, {f"deleted {n}" for n in names}), deleted[2]
    assert left & queues_after == set(), queues_after
    assert enforced.refused(enforced.reaper) == [], enforced.refused(enforced.reaper)
