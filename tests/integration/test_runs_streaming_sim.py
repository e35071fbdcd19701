"""A streaming durable run against the provider simulator over real HTTP (the anthropic provider
streams SSE at the simulator's token rate; providers.from_env in the worker): a reader that drops
halfway and reconnects with its last id gets every delta once, in order; an `overloaded` error
event mid-answer makes the provider begin again, the reader is told to drop the first text, and the
run's spend counts what the cut attempt may have cost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.conftest import Worker
from tests.integration.runs_kit import client_on, spec
from toolloop import PromptGenUsage
from toolloop.embedded import EmbeddedServer
from toolloop.providers.models import default_catalog
from toolloop.sim import SimRequest, SimServer, SimTurn
from workers.client import Client
from workers.protocol.records import RunEventRecord

ANSWER = "The sum is 42. " * 40  # 600 characters: 150 token pieces
ADD = {"name": "add", "input": {"a": 20, "b": 22}}


def policy(request: SimRequest) -> SimTurn:
    """Turn 1 calls `add` after some text, turn 2 answers; "overload" in the prompt: the answer's
    first try ends in an `overloaded_error` event after 20 pieces."""
    first = str(getattr(request.messages[0], "content", ""))
    if request.assistant_turns == 0:
        return SimTurn(text="Adding the numbers. " * 5, tool_calls=[ADD])
    fault = {"kind": "stream_error", "after": 20} if "overload" in first else None
    return SimTurn.model_validate({"text": ANSWER, "fault": fault})


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(policy, tokens_per_s=400) as server:
        yield server


@pytest.fixture
def client(sim_redis: EmbeddedServer, sim_worker: Worker) -> Iterator[Client]:
    yield from client_on(sim_redis)


def run(prompt: str) -> dict[str, object]:
    return spec(
        "You add numbers.",
        user=prompt,
        model="claude-sonnet-5-5",
        provider="anthropic",
        stream=True,
    )


def test_a_reader_reconnecting_with_its_last_id_gets_every_delta_once(
    client: Client,
) -> None:
    run_id = client.enqueue(run("Add 20 and 22."))
    first: list[RunEventRecord] = []
    for event in client.events(run_id, follow=True):
        first.append(event)
        if event.kind == "delta" and event.step == 2 and "42" in event.text:
            break  # the page closed halfway through the answer
    rest = list(client.events(run_id, follow=True, after=first[-1].id))
    stored = list(client.events(run_id))
    assert [e.id for e in first + rest] == [e.id for e in stored]
    assert len({e.id for e in first + rest}) == len(stored)
    assert client.status(run_id).status == "done"
    for model in (e for e in stored if e.kind == "model"):
        text = "".join(
            e.text
            for e in stored[: stored.index(model)]
            if e.kind == "delta" and e.step == model.step
        )
        assert text == model.text
    assert model.text == ANSWER
    assert not [e for e in stored if e.kind == "discarded"]


def test_an_overloaded_error_mid_answer_voids_the_text_streamed_before_it(
    client: Client,
) -> None:
    run_id = client.enqueue(run("Add 20 and 22, overload."))
    seen = list(client.events(run_id, follow=True))
    assert client.status(run_id).status == "done"
    answer = [e for e in seen if not e.committed and e.step == 2]
    marks = [e for e in answer if e.kind == "discarded"]
    assert len(marks) == 1, [(e.kind, e.attempt) for e in answer]
    at = answer.index(marks[0])
    assert answer[:at] and {e.attempt for e in answer[:at]} == {marks[0].attempt}
    before = "".join(e.text for e in answer[:at])
    # 20 pieces, then the error event
    assert ANSWER.startswith(before) and before != ANSWER
    again = answer[at + 1 :]
    assert again and all(e.attempt == f"{marks[0].attempt}.1" for e in again)
    model = next(e for e in seen if e.kind == "model" and e.step == 2)
    assert "".join(e.text for e in again) == model.text == ANSWER
    # the cut attempt may have been billed: its message_start input + its 20 pieces' output count
    price = default_catalog().require("anthropic", "claude-sonnet-5-5").price
    usage = PromptGenUsage.model_validate(model.data["usage"])
    # no cache here
    assert price is not None and usage.cached_tokens == usage.cache_write_tokens == 0
    answer = (
        usage.prompt_tokens * price.input + usage.completion_tokens * price.output
    ) / 1e6
    cut = (usage.prompt_tokens * price.input + 20 * price.output) / 1e6
    assert model.data["cost_usd"] == pytest.approx(answer + cut, abs=1e-9)
    costs = [e.data["cost_usd"] for e in seen if e.kind in ("model", "tool")]
    assert client.status(run_id).spent_usd == pytest.approx(sum(costs), abs=1e-9)
