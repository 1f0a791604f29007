"""A producer process that publishes with OpenTelemetry's Celery instrumentation on.

``python -m tests.integration.traced_producer CASE ARG`` publishes to the test's queue
(configured from the environment, as the workers' app is, ``IT_TRACE_FILE`` included) and
prints the task ids as a JSON list on its last line:

- ``batch COUNT``: ``COUNT`` ``busy`` tasks inside one ``publishing_in_batches()``;
- ``large SIZE``: a ``sized`` task whose argument is ``SIZE`` characters;
- ``countdown SECONDS``: a ``busy`` task due ``SECONDS`` from now;
- ``failing LABEL``: a ``fails`` task that fails every run.
"""

from __future__ import annotations

import json
import sys

from celery_sqs_heartbeat import publishing_in_batches
from tests.integration.app import busy, fails, sized


def publish(case: str, arg: str) -> list[str]:
    if case == "batch":
        with publishing_in_batches():
            results = [busy.apply_async(args=(f"batched-{n}", 0)) for n in range(int(arg))]
    elif case == "large":
        results = [sized.apply_async(args=("large", "x" * int(arg)))]
    elif case == "countdown":
        results = [busy.apply_async(args=("parked", 0), countdown=float(arg))]
    elif case == "failing":
        results = [fails.apply_async(args=(arg, "error"))]
    else:
        raise SystemExit(f"unknown case {case!r}")
    return [str(result.id) for result in results]


if __name__ == "__main__":
    print(json.dumps(publish(sys.argv[1], sys.argv[2])), flush=True)
