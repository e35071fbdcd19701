"""examples/web.py and `toolloop worker` as processes of a test: the bearer token the tests give the
web app (TOOLLOOP_WEB_TOKEN) and the header that sends it, their environment, starting them (the web
app once it answers HTTP), and reading its server-sent events; `serve_app`, a page of another app
on another port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from tests.support.procs import end
from toolloop.embedded import free_port

WEB_TOKEN = "test-web-token-7f3a"
AUTH = {"Authorization": f"Bearer {WEB_TOKEN}"}
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def web_env(redis_url: str) -> dict[str, str]:
    """The environment of examples/web.py and its worker: no real provider keys, a free PORT, the token."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "FAL_KEY")
    }
    env.update(REDIS_URL=redis_url, PORT=str(free_port()), TOOLLOOP_WEB_TOKEN=WEB_TOKEN)
    return env


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def review_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`toolloop worker` whose model is the storyboard review's simulated one."""
    return spawn(
        [
            str(BIN / "toolloop"),
            "worker",
            "-c",
            "4",
            "-l",
            "WARNING",
            "--sim-policy",
            "examples.storyboard.policy:review_policy",
        ],
        env,
        log,
    )


def start_web(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """examples/web.py as a process with `env` (its PORT), logging to `log`, once it answers HTTP
    (ended, and the test failed, if it exits or does not answer within 30 s)."""
    server = spawn([sys.executable, "examples/web.py"], env, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, log.read_text()
            try:
                httpx.get(f"http://127.0.0.1:{env['PORT']}/runs/none", timeout=1)
                return server
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
    except BaseException:
        end(server)
        raise


def serve_web(env: dict[str, str], log: Path) -> Iterator[str]:
    """`start_web`, then its base URL, then it ends: `yield from` it in a fixture."""
    server = start_web(env, log)
    try:
        yield f"http://127.0.0.1:{env['PORT']}"
    finally:
        end(server)


def read_events(
    response: httpx.Response,
) -> Iterator[tuple[str, str, dict[str, object]]]:
    """(id, kind, data) of each server-sent event."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
        elif fields:
            yield fields["id"], fields["event"], json.loads(fields["data"])
            fields = {}


@contextmanager
def serve_app(html: str) -> Iterator[str]:
    """A page of another app (`html` at "/") served on another port of 127.0.0.1, in a thread of the
    test: the same site as the web app, another origin. Yields its URL."""

    def page(request: Request) -> HTMLResponse:
        return HTMLResponse(html)

    port = free_port()
    app = Starlette(routes=[Route("/", page)])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), (
            "the other app did not start"
        )
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
