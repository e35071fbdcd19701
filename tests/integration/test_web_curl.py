"""The curl lines of examples/web.py's docstring, run as written with bash and the real curl against
examples/web.py as a process (port and run id filled in): running the enqueue line twice makes two
runs (a fresh idempotency key each time, not the first run back), and the approvals line carries the
token (a 200, not a 401)."""

from __future__ import annotations

import ast
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.web import ROOT, serve_web, web_env
from toolloop.embedded import EmbeddedServer

pytestmark = pytest.mark.integration

DOC = ast.get_docstring(ast.parse((ROOT / "examples" / "web.py").read_text())) or ""


def curl_lines() -> list[str]:
    """Each curl command of the docstring (continued lines joined), with its comment cut off."""
    commands: list[str] = []
    lines = [line.strip() for line in DOC.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith("curl "):
            command = line
            j = i
            while command.endswith("\\") or (command.count("'") % 2 == 1):
                j += 1
                command = (
                    command.removesuffix("\\")
                    + (" " if command.endswith("\\") else "\n")
                    + lines[j]
                )
            commands.append(command.split("  #", 1)[0].strip())
    return commands


@pytest.fixture
def web(
    redis_server: EmbeddedServer, tmp_path: Path
) -> Iterator[tuple[str, dict[str, str]]]:
    env = web_env(redis_server.url)
    env["TOOLLOOP_TOOLSETS"] = "review=examples.storyboard.tools:REVIEW_TOOLS"
    for url in serve_web(env, tmp_path / "web.log"):
        yield url, env


def bash(command: str, env: dict[str, str], port: str) -> str:
    line = command.replace("localhost:8000", f"127.0.0.1:{port}")
    done = subprocess.run(
        ["bash", "-c", line + " -sS"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, (line, done.stderr)
    return done.stdout


def test_the_docstrings_curl_lines_work_as_written(
    web: tuple[str, dict[str, str]],
) -> None:
    _, env = web
    port = env["PORT"]
    commands = curl_lines()
    enqueue = next(c for c in commands if "-X POST" in c and "/runs " in c + " ")
    first = json.loads(bash(enqueue, env, port))["run_id"]
    time.sleep(1.1)  # a reader runs it again a moment later
    second = json.loads(bash(enqueue, env, port))["run_id"]
    # a fresh key per run: the second is a new run, not the first one back
    assert first != second

    listed = next(c for c in commands if c.endswith("/approvals"))
    reply = json.loads(bash(listed.replace("RUN_ID", first), env, port))
    # authorized (the token is on the line), nothing held yet
    assert reply == {"approvals": []}, reply
