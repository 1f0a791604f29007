"""A producer process that publishes inside a batch-publishing scope, for a test to kill.

``python -m tests.integration.batch_producer CONFIRMED_FILE COUNT`` publishes ``COUNT``
``busy`` tasks to the test's queue (configured from the environment, as the workers'
app is) inside one scope, and appends the task ids of every call SQS confirmed to
``CONFIRMED_FILE``, one a line, as the confirmations come. A line written is in the
kernel's hands: a SIGKILL afterwards cannot take it back.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from celery_sqs_heartbeat import publishing_in_batches
from tests.integration.app import busy


def main(confirmed_file: str, count: int) -> None:
    with open(confirmed_file, "a", buffering=1) as confirmed:

        def note(task_ids: Sequence[str]) -> None:
            confirmed.write("".join(f"{task_id}\n" for task_id in task_ids))
            confirmed.flush()

        with publishing_in_batches(on_confirmed=note):
            for number in range(count):
                busy.apply_async(args=(f"t{number}", 0))
    print("all confirmed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
