"""Durable runs through a real worker whose model is the simulator (anthropic provider over HTTP):
a scripted refusal ends the run `refused` with its category in `toolloop status` and the events; a
tool call cut off at max_tokens is never run (the `add` tool logs every call it makes), its turn is
asked again once with more room, and a turn that never fits fails the run with a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ROOT, Worker
from tests.integration.runs_kit import client_on, logged, spec
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimRequest, SimServer, SimTurn
from workers.client import Client

pytestmark = pytest.mark.integration

TOOLLOOP = str(Path(sys.executable).parent / "toolloop")
MODEL = "claude-sonnet-4-6"
EXPLANATION = "The request could enable exploit development."
REFUSE = "You refuse after one addition."
CUT_ONCE = "Your first answer is cut off."
CUT_ALWAYS = "Your answer never fits."


def add(a: int, b: int) -> dict[str, Any]:
    return {"name": "add", "input": {"a": a, "b": b}}


SCRIPTS: dict[str, list[dict[str, Any]]] = {
    REFUSE: [
        {"text": "Adding first.", "tool_calls": [add(1, 2)]},
        {
            "text": "",
            "tool_calls": [add(5, 5)],
            "refusal": {"category": "cyber", "explanation": EXPLANATION},
        },
    ],
    # the first request gives 8,192 output tokens: the answer needs 10,000, so its last call is cut;
    # the turn asked again with 16,384 fits
    CUT_ONCE: [
        {"tool_calls": [add(11, 12), add(13, 14)], "max_tokens_needed": 10_000},
        {"text": "Both added."},
    ],
    CUT_ALWAYS: [{"tool_calls": [add(7, 8)], "max_tokens_needed": 1_000_000}],
}


def policy(request: SimRequest) -> SimTurn:
    turns = SCRIPTS[str(request.system)]
    index = request.assistant_turns
    return (
        SimTurn.model_validate(turns[index])
        if index < len(turns)
        else SimTurn(text="(end)")
    )


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(policy) as server:
        yield server


@pytest.fixture
def client(sim_redis: EmbeddedServer) -> Iterator[Client]:
    yield from client_on(sim_redis)


def enqueue(client: Client, system: str) -> str:
    return client.enqueue(spec(system, model=MODEL, provider="anthropic"))


def added(worker: Worker) -> list[tuple[float, float]]:
    """Every addition the worker's `add` tool made (each test adds numbers no other test adds)."""
    return [(line["a"], line["b"]) for line in logged(worker.tool_log)]


def cli(redis_url: str, *args: str) -> str:
    env = {**os.environ, "REDIS_URL": redis_url}
    done = subprocess.run(
        [TOOLLOOP, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_refusal_ends_the_run_refused_with_its_category_in_status_and_events(
    sim_redis: EmbeddedServer, sim_worker: Worker, client: Client
) -> None:
    run_id = enqueue(client, REFUSE)
    status = client.wait(run_id, timeout=30)
    assert status.status == "refused", status
    assert status.refusal == {"category": "cyber", "explanation": EXPLANATION}
    assert (1, 2) in added(sim_worker) and (5, 5) not in added(sim_worker)
    events = list(client.events(run_id))
    model = [e.data for e in events if e.kind == "model"]
    assert model[-1]["finish_reason"] == "refusal"
    assert model[-1]["refusal"] == {"category": "cyber", "explanation": EXPLANATION}
    finished = events[-1]
    assert finished.kind == "finished" and finished.data["stopped_by"] == "refused"
    assert finished.data["refusal"]["category"] == "cyber"
    shown = cli(sim_redis.url, "status", run_id)
    assert "refused" in shown and '"category": "cyber"' in shown
    assert (
        json.loads(cli(sim_redis.url, "status", run_id, "--json"))["refusal"][
            "category"
        ]
        == "cyber"
    )
    lines = cli(sim_redis.url, "events", run_id)
    assert (
        "refused (category cyber: The request could enable exploit development.)"
        in lines
    )
    assert "finished: refused (category cyber" in lines


def test_a_cut_off_call_is_never_run_and_the_turn_is_asked_again_with_more_room(
    sim: SimServer, sim_worker: Worker, client: Client
) -> None:
    run_id = enqueue(client, CUT_ONCE)
    status = client.wait(run_id, timeout=30)
    assert status.status == "done" and status.final_text == "Both added.", status
    ran = added(sim_worker)
    # only the retry's calls ran, once
    assert ran.count((13, 14)) == 1 and ran.count((11, 12)) == 1
    model = [e.data for e in client.events(run_id) if e.kind == "model"]
    assert [m["finish_reason"] for m in model] == ["length", "tool_calls", "stop"]
    assert model[0]["tool_calls"][-1]["input"] == {}  # the cut call, seen but never run


def test_a_turn_cut_off_again_fails_the_run_saying_the_answer_did_not_fit(
    sim_worker: Worker, client: Client
) -> None:
    run_id = enqueue(client, CUT_ALWAYS)
    status = client.wait(run_id, timeout=30)
    assert status.status == "failed", status
    assert status.error_class == "PromptGenError"
    assert "did not fit in 16384 output tokens" in str(status.error_message)
    assert (7, 8) not in added(sim_worker)
