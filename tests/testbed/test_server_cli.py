"""The strict server's command line: ``celery-sqs-heartbeat-server``.

A user runs it by hand, for an app of their own: a fixed port the app's broker URL can
name, a line that says how to point Celery at it, faults from the first call, options
refused with the rule they break, and a clean stop whenever the stop comes.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

import celery_sqs_heartbeat
from celery_sqs_heartbeat.testing import cli

REPO = Path(celery_sqs_heartbeat.__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / cli.CONSOLE_SCRIPT
LAUNCHER = [sys.executable, "-m", cli.ENTRY_MODULE]
LAUNCHER_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@contextmanager
def serving(*options: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """The server on a free port, with its first two lines (the URL, then the greeting)."""
    with subprocess.Popen(
        [*LAUNCHER, "--port", "0", *options, "--stop-at-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=LAUNCHER_ENV,
    ) as server:
        assert server.stdout is not None
        lines = [server.stdout.readline(), server.stdout.readline()]
        try:
            yield server, lines
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
            server.wait(timeout=15)


def test_the_port_is_fixed_unless_asked_otherwise() -> None:
    assert cli.DEFAULT_PORT == 9324
    assert cli._parser().parse_args([]).port == 9324
    assert cli._parser().parse_args(["--port", "0"]).port == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--fail-fraction", "2"], "'probability' must be a number from 0 to 1"),
        (["--latency", "0"], "'seconds' must be a positive number"),
        (["--fail-fraction", "0.1", "--fault-kind", "delay"], "needs 'fault_seconds' > 0"),
        (["--fault-kind", "flood"], "invalid choice: 'flood'"),
    ],
)
def test_fault_options_are_refused_with_the_rule_they_break(
    options: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(options)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_without_moto_it_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "moto" else real_find_spec(name)
    )
    monkeypatch.setattr(cli, "_build_server", lambda *_: pytest.fail("it went on to serve"))
    with pytest.raises(SystemExit) as stopped:
        cli.main([])
    assert stopped.value.code == 1
    assert "install the package's testing extra" in capsys.readouterr().err


def test_fault_options_hold_from_the_first_call_and_the_greeting_names_the_broker() -> None:
    with serving(
        "--latency", "0.01", "--fail-fraction", "1", "--fault-kind", "throttle", "--seed", "3"
    ) as (_, (ready, greeting)):
        url = ready.removeprefix(cli.READY_PREFIX).strip()
        port = url.rsplit(":", 1)[1]
        assert f'broker_url = "sqs://testing:testing@127.0.0.1:{port}"' in greeting

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{url}/_strict/faults", timeout=10) as answer:
            pending = json.loads(answer.read())
        assert {"type": "latency", "actions": None, "seconds": 0.01} in pending
        fraction = next(rule for rule in pending if rule["type"] == "fraction")
        assert (fraction["probability"], fraction["kind"], fraction["seed"]) == (1, "throttle", 3)

        sqs = boto3.client(
            "sqs",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
        )
        with pytest.raises(ClientError) as refused:
            sqs.list_queues()
        assert refused.value.response["Error"]["Code"] == "ThrottlingException"


def test_a_stop_right_after_the_ready_line_ends_cleanly() -> None:
    """Whoever waits for the ready line may stop the server at once: exit 0, no traceback."""
    with subprocess.Popen(
        [*LAUNCHER, "--port", "0", "--stop-at-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=LAUNCHER_ENV,
    ) as server:
        assert server.stdout is not None and server.stderr is not None
        assert server.stdout.readline().startswith(cli.READY_PREFIX)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=15) == 0
        assert "Traceback" not in server.stderr.read()


def test_the_console_script_is_the_servers_command() -> None:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    scripts = config["options.entry_points"]["console_scripts"].strip().splitlines()
    assert f"{cli.CONSOLE_SCRIPT} = celery_sqs_heartbeat.testing.cli:main" in scripts
    assert SCRIPT.is_file(), f"{SCRIPT} is missing: reinstall the package (pip install -e .)"
    usage = subprocess.run(
        [str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert usage.startswith(f"usage: {cli.CONSOLE_SCRIPT} ")
