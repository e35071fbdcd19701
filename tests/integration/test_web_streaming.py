"""examples/web.py serving a streaming run over real HTTP: server-sent events with an `id:` each, and
a browser that lost its connection resumes with `Last-Event-ID` and gets every delta once, in order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Worker, own_redis, start_worker
from tests.integration.streamer import answer_words, worker_env
from tests.support.web import AUTH, read_events, serve_web, web_env
from toolloop.embedded import EmbeddedServer

WORDS = 100


@pytest.fixture(scope="module")
def web_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    yield from own_redis(tmp_path_factory, "web-stream-redis")


@pytest.fixture(scope="module")
def web(
    web_redis: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    directory: Path = tmp_path_factory.mktemp("web-stream")
    worker: Worker = start_worker(web_redis.url, directory, worker_env(WORDS, 8))
    try:
        yield from serve_web(web_env(web_redis.url), directory / "web.log")
    finally:
        worker.stop()


def test_sse_resumes_after_last_event_id_with_every_delta_once(web: str) -> None:
    spec = {
        "model": "scripted",
        "toolset": "agents",
        "stream": True,
        "messages": [{"role": "user", "content": "Add."}],
    }
    run_id = httpx.post(f"{web}/runs", json=spec, headers=AUTH, timeout=10).json()[
        "run_id"
    ]
    url = f"{web}/runs/{run_id}/events"
    first: list[tuple[str, str, dict[str, object]]] = []
    with httpx.stream("GET", url, headers=AUTH, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for event in read_events(response):
            first.append(event)
            if sum(kind == "delta" for _, kind, _ in first) == 4:
                break  # the connection drops mid-answer
    resumed = {**AUTH, "Last-Event-ID": first[-1][0]}
    with httpx.stream("GET", url, headers=resumed, timeout=30) as response:
        rest = list(read_events(response))  # until the run's `finished` ends the stream
    assert rest[-1][1] == "finished"
    with httpx.stream("GET", url, headers=AUTH, timeout=30) as response:
        # the run has ended: everything, then the end
        whole = list(read_events(response))
    assert [e[0] for e in first + rest] == [e[0] for e in whole]
    text = "".join(
        str(data["text"])
        for _, kind, data in whole
        if kind == "delta" and data["step"] == 1
    )
    model = next(data for _, kind, data in whole if kind == "model")
    assert text == model["text"] == "".join(answer_words(1, WORDS))
    assert {data["seq"] for _, kind, data in whole if kind == "delta"} == {None}
