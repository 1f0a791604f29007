"""Every shell command and complete Python example on the pages, run.

The README's Quick start runs as pasted, on a free port instead of 9324: the local
server, the app saved as ``tasks.py``, the worker, and a task longer than the lease,
which must be received from SQS once, renewed, and run once. The local server's command
lines start it and its HTTP control commands drive it; the Python examples marked
``docs-test: run`` run, and print what the page says they print. The other commands are
checked by kind (``checks.py``): cheap ones run, long ones (the matrix, the demo, the
full benchmarks) are checked for their script and their flags.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from celery_sqs_heartbeat.testing.cli import DEFAULT_PORT, READY_PREFIX
from tests.docs.checks import CHECKS, kind_of, python_args
from tests.docs.pages import REPO, Block, Command, Page, page_id, pages

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
PORT_TEXT = str(DEFAULT_PORT)


def _commands(*kinds: str) -> list[object]:
    """The pages' commands of these kinds, each once (the first page that gives it)."""
    found: dict[str, Command] = {}
    for page in pages():
        for command in Page(page).commands:
            if kind_of(command) in kinds:
                found.setdefault(str(command), command)
    return [pytest.param(c, id=f"{c.where()} {c}") for c in found.values()]


def _commands_of(path: Path, kind: str) -> list[Command]:
    return [command for command in Page(path).commands if kind_of(command) == kind]


@pytest.mark.parametrize("command", _commands(*CHECKS))
def test_command(command: Command) -> None:
    kind = kind_of(command)
    assert kind is not None
    CHECKS[kind](command)


@pytest.mark.parametrize("command", _commands("local server"))
def test_local_server_command_starts_and_stops(command: Command) -> None:
    with local_server(command) as url:
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5).close()


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, id=page_id(p)) for p in pages() if _commands_of(p, "local server control")],
)
def test_local_server_control_commands(path: Path) -> None:
    """The page's ``curl`` lines, in order, against a server started for them."""
    servers = _commands_of(path, "local server")
    assert servers, f"{page_id(path)}: the page never says how to start the server"
    with local_server(servers[0]) as url:
        port = url.rsplit(":", 1)[1]
        for command in _commands_of(path, "local server control"):
            words = [word.replace(f":{PORT_TEXT}/", f":{port}/") for word in command.words]
            answer = _curl(words)
            assert "error" not in json.loads(answer or "{}"), f"{command}: {answer}"


def _example_blocks() -> list[object]:
    return [
        pytest.param(block, id=block.where())
        for page in pages()
        for block in Page(page).blocks
        if block.marker == "docs-test: run"
    ]


@pytest.mark.parametrize("block", _example_blocks())
def test_python_example_runs_and_prints_what_the_page_says(block: Block, tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(block.text)
    process = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    printed = _printed_block_after(block)
    if printed is not None:
        assert _without_ports(process.stdout) == _without_ports(printed)


def _printed_block_after(block: Block) -> str | None:
    """The page's ``docs-test: output`` block right after ``block``, if it has one."""
    blocks = Page(block.page).blocks
    following = blocks[blocks.index(block) + 1 :]
    if following and following[0].marker == "docs-test: output":
        return following[0].text
    return None


def _without_ports(text: str) -> str:
    return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)


def test_readme_quick_start_runs_a_task_longer_than_the_lease_once(tmp_path: Path) -> None:
    readme = Page(REPO / "README.md")
    by_kind = {kind_of(command): command for command in readme.commands}
    app = next(block for block in readme.blocks if block.marker == "docs-test: tasks.py")
    task = by_kind["quick start task"]
    lease = re.search(r'"visibility_timeout": (\d+)', app.text)
    task_seconds = re.search(r"slow\.delay\((\d+)\)", task.words[2])
    assert lease and task_seconds, "the Quick start no longer sets its lease or its task"
    assert int(task_seconds[1]) > int(lease[1]), "the Quick start's task must outlast the lease"

    with local_server(by_kind["local server"]) as url:
        port = url.rsplit(":", 1)[1]
        (tmp_path / "tasks.py").write_text(app.text.replace(f":{PORT_TEXT}", f":{port}"))
        with _worker(by_kind["quick start worker"], tmp_path) as log:
            _wait_for(log, " ready.", timeout=60)
            _run_in(task, tmp_path)
            _wait_for(log, "succeeded", timeout=int(task_seconds[1]) + 60)
        events = _control(url, "events")

    text = log.read_text()
    assert len(re.findall(r"Task tasks\.slow\[\S+\] received", text)) == 1, text
    assert len(re.findall(r"Task tasks\.slow\[\S+\] succeeded", text)) == 1, text
    assert _quoted_log_line(readme) in " ".join(text.split()), text
    receives = [e for e in events if e["action"] == "receive" and e["result"] == "ok"]
    renewals = [e for e in events if e["action"] == "change_visibility" and e["result"] == "ok"]
    assert len(receives) == 1 and renewals, events


def _quoted_log_line(readme: Page) -> str:
    """What the README says the worker's log shows, less its closing ellipsis."""
    said = re.search(r"Its log says what the transport does \(`([^`]*?) …`\)", readme.text)
    assert said is not None, "the Quick start no longer quotes the worker's log"
    return " ".join(said[1].split())


@contextmanager
def local_server(command: Command) -> Iterator[str]:
    """The page's server command on a free port; its URL while it serves."""
    words = list(command.words[1:])
    if "--port" in words:
        index = words.index("--port") + 1
        words[index] = "0" if words[index] in ("0", PORT_TEXT) else words[index]
    else:
        words += ["--port", "0"]
    program = BIN / command.program
    assert program.is_file(), f"{program} is not installed: pip install -e '.[testing]'"
    with subprocess.Popen(
        [str(program), *words, "--stop-at-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as server:
        assert server.stdout is not None
        ready = server.stdout.readline()
        assert ready.startswith(READY_PREFIX), f"{command}: {ready!r}"
        try:
            yield ready[len(READY_PREFIX) :].strip()
        finally:
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=15) == 0


@contextmanager
def _worker(command: Command, folder: Path) -> Iterator[Path]:
    """The Quick start's worker, in the folder of ``tasks.py``; its log file."""
    log = folder / "worker.log"
    with (
        log.open("w") as output,
        subprocess.Popen(
            [str(BIN / "celery"), *command.words[1:]],
            cwd=folder,
            env=_page_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
        ) as worker,
    ):
        try:
            yield log
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                raise


def _page_env() -> dict[str, str]:
    """The shell of a reader who activated the virtualenv: its bin first on PATH.

    PYTHONPATH names this tree, so that the worker runs the package under test (in a
    copy of the tree, an editable install would point elsewhere).
    """
    return {
        **os.environ,
        "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
        "PYTHONPATH": str(REPO),
    }


def _run_in(command: Command, folder: Path) -> None:
    args = python_args(command)
    assert args is not None
    subprocess.run([sys.executable, *args], cwd=folder, env=_page_env(), check=True, timeout=60)


def _wait_for(log: Path, text: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n{log.read_text()}"
        time.sleep(0.2)


def _control(url: str, route: str) -> list[dict[str, object]]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/_strict/{route}", timeout=10) as answer:
        result: list[dict[str, object]] = json.loads(answer.read())
        return result


def _curl(words: list[str]) -> str:
    """Run a page's curl line; without curl on the machine, make the same request."""
    if shutil.which("curl"):
        process = subprocess.run(words, capture_output=True, text=True, timeout=30, check=False)
        assert process.returncode == 0, f"{words}: {process.stderr}"
        return process.stdout
    method = words[words.index("-X") + 1] if "-X" in words else "GET"
    data = words[words.index("-d") + 1].encode() if "-d" in words else None
    url = next(word for word in words if word.startswith("http"))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(urllib.request.Request(url, data=data, method=method), timeout=10) as a:
        return str(a.read().decode())


def test_every_page_command_is_covered_here() -> None:
    """A kind of command with no check here would pass unseen."""
    handled_here = {
        "local server",
        "local server control",
        "quick start worker",
        "quick start task",
    }
    kinds = {kind_of(c) for page in pages() for c in Page(page).commands}
    assert kinds <= set(CHECKS) | handled_here, kinds - set(CHECKS) - handled_here
    assert {page_id(page) for page in pages()} >= {"README.md", "docs/local-sqs.md"}
