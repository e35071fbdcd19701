"""examples/web.py as a real process: enqueue a run over HTTP, follow its server-sent events, answer
its question, and see it finish; a worker (`toolloop worker` with the storyboard's simulated model)
does the run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import end
from tests.support.web import AUTH, read_events, review_worker, serve_web, web_env
from toolloop.embedded import EmbeddedServer

SPEC = {
    "model": "claude-sonnet-5-5",
    "toolset": "review",
    "messages": [{"role": "user", "content": "Review the rough cut."}],
    "keep_images": None,
}


@pytest.fixture
def web(redis_server: EmbeddedServer, tmp_path: Path) -> Iterator[str]:
    env = web_env(redis_server.url)
    worker = review_worker(env, tmp_path / "worker.log")
    try:
        yield from serve_web(env, tmp_path / "web.log")
    finally:
        end(worker)


def test_enqueue_stream_answer_finish(web: str) -> None:
    # no token: nothing
    assert httpx.get(f"{web}/runs/nope", timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer wrong"}
    assert (
        httpx.post(f"{web}/runs", json=SPEC, headers=wrong, timeout=10).status_code
        == 401
    )
    with httpx.Client(base_url=web, timeout=60, headers=AUTH) as http:
        assert http.get("/runs/nope").status_code == 404
        bad = http.post(
            "/runs", json={**SPEC, "toolset": "examples.storyboard.tools:REVIEW_TOOLS"}
        )
        assert (
            bad.status_code == 422
            and "the registered toolsets are" in bad.json()["error"]
        )
        assert http.post("/runs", json={**SPEC, "max_steps": 0}).status_code == 422

        json_body = {"content-type": "application/json"}
        assert (
            http.post("/runs", content=b"{not json", headers=json_body).status_code
            == 400
        )
        assert http.post("/runs", content=b"{not json").status_code == 415  # JSON only

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
                    assert (
                        http.post(
                            f"/runs/{run_id}/answer", content=b"Keep it"
                        ).status_code
                        == 415
                    )
                    plain = http.post(
                        f"/runs/{run_id}/answer",
                        content=b'"Keep it"',
                        headers=json_body,
                    )
                    assert plain.status_code == 400
                    assert "Shot 3" in str(data["asked"])
                    answered = http.post(
                        f"/runs/{run_id}/answer", json={"content": "Keep shot 3."}
                    )
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
        assert (
            cancel.status_code == 409 and "has ended (done)" in cancel.json()["error"]
        )
        listed = http.get("/runs", params={"status": "done", "limit": 5}).json()
        assert run_id in [run["run_id"] for run in listed["runs"]]
        # a follow-up continues the ended run (docs/conversations.md); then it ends again
        followed = http.post(
            f"/runs/{run_id}/messages", json={"content": "Thanks. Anything else?"}
        )
        assert followed.status_code == 202 and followed.json() == {
            "what": "continued",
            "segment": 2,
        }
        deadline = time.monotonic() + 60
        while http.get(f"/runs/{run_id}").json()["status"] in ("queued", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        said = [
            m["content"]
            for m in http.get(f"/runs/{run_id}/messages").json()
            if m["role"] == "user"
        ]
        assert said[-1] == "Thanks. Anything else?" or "Thanks. Anything else?" in said
        # the conversation's images (the frames read_frame returned) are served to the viewer
        parts = [
            p
            for m in http.get(f"/runs/{run_id}/messages").json()
            if m["role"] == "tool"
            for p in (m["content"] if isinstance(m["content"], list) else [])
        ]
        image = next(p for p in parts if p["type"] == "image")
        served = http.get(f"/runs/{run_id}/images/{image['hash']}")
        assert (
            served.status_code == 200 and served.headers["content-type"] == "image/png"
        )
        assert served.content == Path(image["path"]).read_bytes()
        assert http.get(f"/runs/{run_id}/images/{'0' * 64}").status_code == 404
