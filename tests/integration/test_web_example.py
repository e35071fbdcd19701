"""examples/web.py as a real process: enqueue a run over HTTP, follow its server-sent events, answer
its question, and see it finish; a worker (`toolloop worker` with the storyboard's simulated model)
does the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.web import AUTH, WEB_TOKEN
from toolloop.embedded import EmbeddedServer, free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SPEC = {
    "model": "claude-sonnet-5-5",
    "toolset": "review",
    "messages": [{"role": "user", "content": "Review the rough cut."}],
    "keep_images": None,
}


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture
def web(redis_server: EmbeddedServer, tmp_path: Path) -> Iterator[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "FAL_KEY")}
    env.update(REDIS_URL=redis_server.url, PORT=str(free_port()), TOOLLOOP_WEB_TOKEN=WEB_TOKEN)
    worker = spawn(
        [str(BIN / "toolloop"), "worker", "-c", "4", "-l", "WARNING",
         "--sim-policy", "examples.storyboard.policy:review_policy"],
        env, tmp_path / "worker.log",
    )  # fmt: skip
    try:
        yield from serve_web(env, tmp_path / "web.log")
    finally:
        end(worker)


def serve_web(env: dict[str, str], log: Path) -> Iterator[str]:
    """examples/web.py as a process with `env` (its PORT), logging to `log`: yields its base URL once
    it answers HTTP, and ends it after."""
    server = spawn([sys.executable, "examples/web.py"], env, log)
    base = f"http://127.0.0.1:{env['PORT']}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()
            try:
                httpx.get(f"{base}/runs/none", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        yield base
    finally:
        end(server)


def read_events(response: httpx.Response) -> Iterator[tuple[str, str, dict[str, object]]]:
    """(id, kind, data) of each server-sent event."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
        elif fields:
            yield fields["id"], fields["event"], json.loads(fields["data"])
            fields = {}


def test_enqueue_stream_answer_finish(web: str) -> None:
    assert httpx.get(f"{web}/runs/nope", timeout=10).status_code == 401  # no token: nothing
    wrong = {"Authorization": "Bearer wrong"}
    assert httpx.post(f"{web}/runs", json=SPEC, headers=wrong, timeout=10).status_code == 401
    with httpx.Client(base_url=web, timeout=60, headers=AUTH) as http:
        assert http.get("/runs/nope").status_code == 404
        bad = http.post("/runs", json={**SPEC, "toolset": "examples.storyboard.tools:REVIEW_TOOLS"})
        assert bad.status_code == 422 and "the registered toolsets are" in bad.json()["error"]
        assert http.post("/runs", json={**SPEC, "max_steps": 0}).status_code == 422

        assert http.post("/runs", content=b"{not json").status_code == 400

        created = http.post("/runs", json=SPEC)
        assert created.status_code == 201
        run_id = created.json()["run_id"]
        kinds: list[str] = []
        last_id = ""
        with http.stream("GET", f"/runs/{run_id}/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            for event_id, kind, data in read_events(stream):
                kinds.append(kind)
                last_id = event_id
                if kind == "parked":
                    assert http.post(f"/runs/{run_id}/answer", content=b"Keep it").status_code == 400
                    assert "Shot 3" in str(data["asked"])
                    answered = http.post(f"/runs/{run_id}/answer", json={"content": "Keep shot 3."})
                    assert answered.status_code == 202
        assert kinds[0] == "queued" and kinds[-1] == "finished"
        assert kinds.count("model") == 5 and "answered" in kinds and "resumed" in kinds
        status = http.get(f"/runs/{run_id}").json()
        assert status["status"] == "done" and "Keep shot 3." in status["final_text"]
        assert http.get(f"/runs/{run_id}/messages").json()[-1]["role"] == "assistant"
        # a reconnect after the end gets 204, so an EventSource stops
        again = http.get(f"/runs/{run_id}/events", headers={"last-event-id": last_id})
        assert again.status_code == 204
        # an ended run takes no answer and no cancel: 409 with a message that says so
        late = http.post(f"/runs/{run_id}/answer", json={"content": "Too late."})
        assert late.status_code == 409 and "has ended (done)" in late.json()["error"]
        cancel = http.post(f"/runs/{run_id}/cancel")
        assert cancel.status_code == 409 and "has ended (done)" in cancel.json()["error"]
        listed = http.get("/runs", params={"status": "done", "limit": 5}).json()
        assert run_id in [run["run_id"] for run in listed["runs"]]
        # the conversation's images (the frames read_frame returned) are served to the viewer
        parts = [p for m in http.get(f"/runs/{run_id}/messages").json() if m["role"] == "tool"
                 for p in (m["content"] if isinstance(m["content"], list) else [])]  # fmt: skip
        image = next(p for p in parts if p["type"] == "image")
        served = http.get(f"/runs/{run_id}/images/{image['hash']}")
        assert served.status_code == 200 and served.headers["content-type"] == "image/png"
        assert served.content == Path(image["path"]).read_bytes()
        assert http.get(f"/runs/{run_id}/images/{'0' * 64}").status_code == 404
