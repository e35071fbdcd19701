"""Every fault kind of the simulator over real HTTP (httpx), on both wires."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from toolloop.sim import SimRequest, SimServer, SimTurn

ANTHROPIC = {"x-api-key": "test-key", "anthropic-version": "2023-06-01"}
FAL = {"Authorization": "Key test-key"}


def anthropic_body(text: str = "Review the board.") -> dict[str, Any]:
    return {
        "model": "claude-sonnet-5-5",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": text}],
    }


def fal_body(text: str = "Review the board.") -> dict[str, Any]:
    return {
        "model": "anthropic/claude-opus-5.5",
        "messages": [{"role": "user", "content": text}],
    }


def post_anthropic(
    sim: SimServer, body: dict[str, Any] | None = None, **kwargs: Any
) -> httpx.Response:
    return httpx.post(
        f"{sim.base_url}/v1/messages",
        headers=ANTHROPIC,
        json=body or anthropic_body(),
        **kwargs,
    )


def post_fal(
    sim: SimServer, body: dict[str, Any] | None = None, **kwargs: Any
) -> httpx.Response:
    path = "/openrouter/router/openai/v1/chat/completions"
    return httpx.post(
        sim.base_url + path, headers=FAL, json=body or fal_body(), **kwargs
    )


@pytest.fixture
def faulty() -> Iterator[SimServer]:
    """A policy whose first turn carries the fault named by the user's text (JSON)."""

    def policy(request: SimRequest) -> SimTurn:
        first = request.messages[0].content
        assert isinstance(first, str)
        fault = json.loads(first) if first.startswith("{") else None
        return SimTurn.model_validate({"text": "Fine.", "fault": fault})

    with SimServer(policy) as sim:
        yield sim


def test_429_with_retry_after_for_the_first_two_tries_then_the_answer(
    faulty: SimServer,
) -> None:
    body = anthropic_body('{"status": 429, "retry_after": 1, "times": 2}')
    first, second, third = (post_anthropic(faulty, body) for _ in range(3))
    for response in (first, second):
        assert response.status_code == 429
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["type"] == "rate_limit_error"
    assert third.status_code == 200 and third.json()["content"][0]["text"] == "Fine."
    assert faulty.stats()["faults"] == {"error:429": 2}


STATUSES = [
    (500, "api_error"),
    (529, "overloaded_error"),
    (401, "authentication_error"),
    (403, "permission_error"),
]


@pytest.mark.parametrize(("status", "kind"), STATUSES)
def test_status_faults_use_the_anthropic_error_format(
    faulty: SimServer, status: int, kind: str
) -> None:
    response = post_anthropic(faulty, anthropic_body(json.dumps({"status": status})))
    assert response.status_code == status
    assert (
        response.json()["type"] == "error" and response.json()["error"]["type"] == kind
    )
    assert (
        post_anthropic(
            faulty, anthropic_body(json.dumps({"status": status}))
        ).status_code
        == 200
    )


def test_status_faults_on_fal_use_its_error_format(faulty: SimServer) -> None:
    body = fal_body('{"status": 529, "times": 1, "message": "Overloaded, try later."}')
    response = post_fal(faulty, body)
    assert response.status_code == 529
    assert response.json()["error"]["message"] == "Overloaded, try later."
    assert post_fal(faulty, body).json()["choices"][0]["message"]["content"] == "Fine."


def test_faults_count_per_conversation(faulty: SimServer) -> None:
    fault = {"status": 500, "times": 1}
    first = post_anthropic(faulty, anthropic_body(json.dumps(fault)))
    other = post_anthropic(
        faulty, anthropic_body(json.dumps(fault | {"message": "another conversation"}))
    )
    assert (first.status_code, other.status_code) == (500, 500)


def test_times_null_fails_every_time(faulty: SimServer) -> None:
    body = anthropic_body('{"status": 500, "times": null}')
    assert [post_anthropic(faulty, body).status_code for _ in range(4)] == [500] * 4


def test_a_timeout_fault_outlasts_a_short_client_timeout_then_answers(
    faulty: SimServer,
) -> None:
    body = anthropic_body('{"kind": "timeout", "seconds": 1.5}')
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        post_anthropic(faulty, body, timeout=0.3)
    assert time.monotonic() - started < 1.2
    retried = post_anthropic(faulty, body, timeout=5)
    assert retried.status_code == 200 and retried.elapsed.total_seconds() < 1.0


def test_a_drop_fault_closes_the_connection_without_a_response(
    faulty: SimServer,
) -> None:
    body = anthropic_body('{"kind": "drop"}')
    with pytest.raises(httpx.RemoteProtocolError):
        post_anthropic(faulty, body)
    assert post_anthropic(faulty, body).status_code == 200
    fal = fal_body('{"kind": "drop"}')
    with pytest.raises(httpx.RemoteProtocolError):
        post_fal(faulty, fal)
    assert faulty.stats()["faults"] == {"drop": 2}
    assert faulty.stats()["statuses"] == {"dropped": 2, "200": 1}


def test_a_refusal_fault_on_each_wire(faulty: SimServer) -> None:
    anthropic = post_anthropic(faulty, anthropic_body('{"kind": "refusal"}')).json()
    assert anthropic["stop_reason"] == "refusal"
    fal = post_fal(faulty, fal_body('{"kind": "refusal"}')).json()
    assert fal["choices"][0]["finish_reason"] == "content_filter"


def test_tool_arguments_that_are_not_json() -> None:
    script = [{"tool_calls": [{"name": "read_frame", "raw_arguments": '{"shot": 3'}]}]
    with SimServer(script) as sim:
        call = post_fal(sim).json()["choices"][0]["message"]["tool_calls"][0]
        assert call["function"] == {"name": "read_frame", "arguments": '{"shot": 3'}
        block = post_anthropic(sim).json()["content"][0]
        assert block["type"] == "tool_use" and block["input"] == '{"shot": 3'


def test_a_policy_that_raises_is_a_500_naming_the_error() -> None:
    def policy(request: SimRequest) -> SimTurn:
        raise KeyError("no such shot")

    with SimServer(policy) as sim:
        response = post_anthropic(sim)
    assert response.status_code == 500
    assert "no such shot" in response.json()["error"]["message"]


def test_a_stream_flag_that_is_not_a_boolean_is_a_400_that_says_so(
    faulty: SimServer,
) -> None:
    response = post_anthropic(faulty, anthropic_body() | {"stream": "yes"})
    assert response.status_code == 400
    assert "stream" in response.json()["error"]["message"]


def test_a_body_that_is_not_json_is_a_400(faulty: SimServer) -> None:
    response = httpx.post(
        f"{faulty.base_url}/v1/messages", headers=ANTHROPIC, content=b"\xff{not json"
    )
    assert (
        response.status_code == 400
        and response.json()["error"]["type"] == "invalid_request_error"
    )
