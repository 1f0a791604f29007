"""Takes ``docs/images/flower-tasks.png``: Flower's task page over this transport.

Headless Chromium from Debian's packages, then this script, from the repository root in
the project's virtualenv (flower 2.2 and moto installed):

    apt-get install -y chromium
    .venv/bin/python benchmarks/flower_screenshot.py     # --output PATH

It starts the strict SQS server (SQS and SNS) on 127.0.0.1, a ``celery worker -E -P
prefork -c 2`` and Flower, both with this module as their Celery app and the transport
options ``supports_fanout`` and ``events_through_sns``; waits for Flower to see the
worker online; sends tasks that succeed, fail, and one that runs for minutes; waits for
Flower's REST API to list each in that state; then runs

    chromium --headless --screenshot=PATH --window-size=1400,900 \
        --virtual-time-budget=5000 http://127.0.0.1:PORT/tasks

(with ``--no-sandbox`` when run as root, and a throw-away profile), and stops everything.
Flower's task page fills its table from ``/tasks/datatable`` by JavaScript: the virtual
time budget lets that finish before the picture is taken.

The app below is what the worker and Flower import (``-A flower_screenshot``),
configured from ``SHOT_*`` environment variables this script sets.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery
from spawned import Spawned

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
#: Where the picture goes, for docs/monitoring-compared.md.
SCREENSHOT = REPO / "docs" / "images" / "flower-tasks.png"
OPTIONS = {
    "region": "us-east-1",
    "is_secure": False,
    "visibility_timeout": 10,
    "supports_fanout": True,
    "events_through_sns": True,
}
#: What the page should show before it is taken, by Flower's task state.
EXPECTED = {"SUCCESS": 6, "FAILURE": 2, "STARTED": 1}
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))

app = Celery("shop")
app.conf.update(
    broker_url=os.environ.get("SHOT_BROKER_URL", "sqs://"),
    broker_transport="celery_sqs_heartbeat:Transport",
    broker_transport_options=json.loads(os.environ.get("SHOT_OPTIONS", "{}")),
    broker_connection_retry_on_startup=False,
    task_default_queue=os.environ.get("SHOT_QUEUE", "shop"),
    task_acks_late=True,
    worker_prefetch_multiplier=1,
)


class CardDeclined(Exception):
    """What a payment provider answers for an amount over the card's limit."""


@app.task(name="shop.resize_image")  # type: ignore[untyped-decorator]
def resize_image(photo_id: int, width: int) -> str:
    time.sleep(0.3)
    return f"photo {photo_id} at {width}px"


@app.task(name="shop.charge_card")  # type: ignore[untyped-decorator]
def charge_card(order_id: int, amount: float) -> str:
    if amount > 500:
        raise CardDeclined(f"order {order_id}: {amount:.2f} is over the card's limit")
    return f"order {order_id} charged {amount:.2f}"


@app.task(name="shop.build_monthly_report")  # type: ignore[untyped-decorator]
def build_monthly_report(month: str) -> str:
    time.sleep(600)
    return f"report {month}"


def wait_for(find: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := find()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)
    return found


def http_json(url: str) -> Any:
    try:
        with HTTP.open(url, timeout=30) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError):
        return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def environment(broker_url: str, queue: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SHOT_BROKER_URL=broker_url,
        SHOT_OPTIONS=json.dumps(OPTIONS),
        SHOT_QUEUE=queue,
        PYTHONPATH=os.pathsep.join([str(REPO), str(HERE)]),
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        FLOWER_UNAUTHENTICATED_API="1",
    )
    return env


def send_tasks(producer: Celery, queue: str) -> None:
    """Six that succeed, two that fail, and one that is still running for the picture."""
    for photo_id, width in ((4711, 640), (4712, 1280), (4713, 320), (4714, 800)):
        producer.send_task("shop.resize_image", args=(photo_id, width), queue=queue)
    for order_id, amount in ((1041, 59.90), (1042, 1250.00), (1043, 18.50), (1044, 720.00)):
        producer.send_task("shop.charge_card", args=(order_id, amount), queue=queue)
    producer.send_task("shop.build_monthly_report", args=("2026-10",), queue=queue)


def states(base: str) -> Counter[str]:
    return Counter(task["state"] for task in (http_json(f"{base}/api/tasks") or {}).values())


def shown(base: str) -> bool:
    found = states(base)
    return all(found[state] >= count for state, count in EXPECTED.items())


def screenshot(url: str, output: Path, logs: Path) -> None:
    """Chromium's headless screenshot, after the page's scripts had 5 s of virtual time."""
    command = [
        "chromium",
        "--headless",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-proxy-server",
        f"--user-data-dir={logs / 'chromium-profile'}",
        f"--screenshot={output}",
        "--window-size=1400,900",
        "--virtual-time-budget=5000",
        url,
    ]
    if os.geteuid() == 0:
        command.insert(1, "--no-sandbox")
    with (logs / "chromium.log").open("w") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=120, check=True)


def run(output: Path, logs: Path) -> None:
    # The server of the tree this script is in; imported here, not by the worker and
    # Flower, which import this module only for its app.
    sys.path.insert(0, str(REPO))
    from celery_sqs_heartbeat.testing import StrictSQSServer

    queue = "shop"
    with StrictSQSServer() as server:
        env = environment(server.broker_url, queue)
        celery = [sys.executable, "-m", "celery", "-A", "flower_screenshot"]
        port = free_port()
        worker = Spawned(
            [*celery, "worker", "-E", "-P", "prefork", "-c", "2", "-n", "shop@%h", "-l", "info"],
            env,
            logs / "worker.log",
            HERE,
        )
        flower = Spawned(
            [*celery, "flower", "--address=127.0.0.1", f"--port={port}"],
            env,
            logs / "flower.log",
            HERE,
        )
        producer = Celery("shop-producer", set_as_current=False)
        producer.conf.update(
            broker_url=server.broker_url,
            broker_transport="celery_sqs_heartbeat:Transport",
            broker_transport_options=OPTIONS,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for(
                lambda: any((http_json(f"{base}/api/workers?status=1") or {}).values()),
                120,
                "Flower to see the worker online",
            )
            send_tasks(producer, queue)
            wait_for(lambda: shown(base), 120, f"Flower to list {EXPECTED}")
            listed = states(base)
            screenshot(f"{base}/tasks", output, logs)
        finally:
            producer.close()
            flower.stop(signal.SIGTERM)
            # A cold shutdown: the report task would hold a warm one for minutes.
            worker.stop(signal.SIGQUIT)
    print(f"wrote {output}: Flower listed {dict(listed)}; logs in {logs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=SCREENSHOT)
    parser.add_argument("--logs", type=Path, help="where the processes' logs go (a new folder)")
    args = parser.parse_args()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="flower-screenshot-"))
    logs.mkdir(parents=True, exist_ok=True)
    run(args.output.resolve(), logs)


if __name__ == "__main__":
    main()
