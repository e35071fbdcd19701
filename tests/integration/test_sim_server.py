"""SimServer's lifecycle, the /_sim endpoints and latency injection."""

from __future__ import annotations

import time

import httpx
import pytest

from toolloop.sim import SimServer

HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
BODY = {
    "model": "claude-sonnet-5-5",
    "max_tokens": 10,
    "messages": [{"role": "user", "content": "Hi"}],
}


def test_start_returns_once_it_accepts_connections_and_stop_closes_the_port() -> None:
    sim = SimServer(["Hello."]).start()
    try:
        assert sim.base_url == f"http://127.0.0.1:{sim.port}" and sim.port > 0
        assert (
            httpx.post(
                f"{sim.base_url}/v1/messages", json=BODY, headers=HEADERS
            ).status_code
            == 200
        )
        assert sim.start() is sim  # a second start is a no-op
    finally:
        sim.stop()
    sim.stop()  # idempotent
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{sim.base_url}/v1/messages", json=BODY, headers=HEADERS)


def test_stats_and_reset_over_http() -> None:
    with SimServer([{"text": "Hi", "fault": {"status": 500}}, "Done."]) as sim:
        assert (
            httpx.post(
                f"{sim.base_url}/v1/messages", json=BODY, headers=HEADERS
            ).status_code
            == 500
        )
        assert (
            httpx.post(
                f"{sim.base_url}/v1/messages", json=BODY, headers=HEADERS
            ).status_code
            == 200
        )
        stats = httpx.get(f"{sim.base_url}/_sim/stats").json()
        assert stats["requests"] == 2 and stats["endpoints"] == {"anthropic": 2}
        assert stats["statuses"] == {"500": 1, "200": 1} and stats["faults"] == {
            "error:500": 1
        }
        assert httpx.post(f"{sim.base_url}/_sim/reset").json() == {"ok": True}
        assert sim.stats()["requests"] == 0
        # the fault counters are forgotten too: the fault is served again
        assert (
            httpx.post(
                f"{sim.base_url}/v1/messages", json=BODY, headers=HEADERS
            ).status_code
            == 500
        )


def test_the_servers_latency_and_the_turns_latency_add_up() -> None:
    with SimServer([{"text": "Slow.", "latency_s": 0.4}], latency_s=0.3) as sim:
        started = time.monotonic()
        response = httpx.post(f"{sim.base_url}/v1/messages", json=BODY, headers=HEADERS)
        elapsed = time.monotonic() - started
    assert response.json()["content"][0]["text"] == "Slow."
    assert 0.7 <= elapsed < 2.0


def test_an_async_policy_is_awaited() -> None:
    async def policy(request: object) -> str:
        return "From a coroutine."

    with SimServer(policy) as sim:
        response = httpx.post(f"{sim.base_url}/v1/messages", json=BODY, headers=HEADERS)
    assert response.json()["content"][0]["text"] == "From a coroutine."


def test_an_answer_over_max_tokens_is_cut_with_stop_reason_max_tokens() -> None:
    script = [
        {
            "text": "word " * 100,
            "tool_calls": [{"name": "read_frame", "input": {"shot": 3}}],
        }
    ]
    with SimServer(script) as sim:
        cut = httpx.post(
            f"{sim.base_url}/v1/messages",
            json=BODY | {"max_tokens": 10},
            headers=HEADERS,
        ).json()
        fal = httpx.post(
            f"{sim.base_url}/openrouter/router/openai/v1/chat/completions",
            json={
                "model": "m",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "Hi"}],
            },
            headers={"Authorization": "Key k"},
        ).json()
        whole = httpx.post(
            f"{sim.base_url}/v1/messages",
            json=BODY | {"max_tokens": 1000},
            headers=HEADERS,
        ).json()
    assert cut["stop_reason"] == "max_tokens" and cut["usage"]["output_tokens"] == 10
    assert [block["type"] for block in cut["content"]] == ["text"] and cut["content"][
        0
    ]["text"] == "word " * 8
    assert (
        fal["choices"][0]["finish_reason"] == "length"
        and "tool_calls" not in fal["choices"][0]["message"]
    )
    assert whole["stop_reason"] == "tool_use"
