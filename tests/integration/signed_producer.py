"""A producer process that signs what it publishes, as the workers' app does.

``python -m tests.integration.signed_producer < SENDS`` publishes the tasks in ``SENDS``
(JSON on stdin, for arguments of any size:
``{"batched": bool, "tasks": [{"task": name, "args": [...], "countdown": s}]}``)
to the test's queue through the app of :mod:`tests.integration.app`, configured from the
environment (``IT_SECURITY_DIR`` makes it call ``app.setup_security()``), inside
``publishing_in_batches()`` if ``batched``; it prints the task ids, as JSON, one list.

A process of its own, because ``setup_security()`` changes kombu's serializer registry
for the whole process: it would refuse JSON in the test process afterwards.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

from celery_sqs_heartbeat import publishing_in_batches
from tests.integration.app import app


def main(sends: dict[str, Any]) -> None:
    scope = publishing_in_batches() if sends.get("batched") else contextlib.nullcontext()
    with scope:
        ids = [
            app.send_task(
                f"tests.integration.app.{task['task']}",
                args=task.get("args", []),
                countdown=task.get("countdown"),
            ).id
            for task in sends["tasks"]
        ]
    print(json.dumps(ids), flush=True)


if __name__ == "__main__":
    main(json.load(sys.stdin))
