"""Ask: a run parks on the model's question and the answer, arriving through the client, resumes it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.runs_kit import client_on, eventually, kinds, spec
from toolloop import AssistantMessage, ToolMessage, UserMessage
from workers.client import Client


@pytest.fixture
def client(runs_redis, worker) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    yield from client_on(runs_redis)


def test_an_ask_parks_the_run_and_the_answer_resumes_it(client: Client) -> None:
    run_id = client.enqueue(spec("ask"))
    parked = client.wait(run_id, timeout=20)
    assert parked.status == "asked"
    assert parked.asked == {"question": "Which shot?"}
    # a parked run needs no sweeping: the sweeper drops it from the live index, the answer puts it back
    eventually(lambda: client.redis.zscore("tl:runs:live", run_id) is None)

    client.answer(run_id, "Shot 3")
    status = client.wait(run_id, timeout=20)
    assert status.status == "done", status
    assert status.final_text == "You said: Shot 3"
    assert status.segment == 1 and status.steps == 2 and status.asked is None
    assert status.spent_usd == pytest.approx(0.02)

    history = client.history(run_id)
    assert [type(m) for m in history] == [
        UserMessage,
        AssistantMessage,
        ToolMessage,
        AssistantMessage,
    ]
    ask_call = history[1].tool_calls[0]  # type: ignore[union-attr]
    assert ask_call.name == "ask"
    assert history[2] == ToolMessage(tool_call_id=ask_call.id, content="Shot 3")
    assert kinds(client, run_id) == [
        "queued",
        "model",
        "parked",
        "answered",
        "resumed",
        "model",
        "finished",
    ]


def test_an_answer_sent_twice_counts_once(client: Client, tmp_path: Path) -> None:
    # after the answer the run holds at a gate: it cannot end before "second"
    gate = tmp_path / "open"
    run_id = client.enqueue(spec("ask_gated", str(gate)))
    assert client.wait(run_id, timeout=20).status == "asked"
    client.answer(run_id, "first")
    # ignored when sent, or kept for a next question never asked
    client.answer(run_id, "second")
    # (two answers both sent while the run is parked: tests/unit/test_races.py, handled in any order)
    gate.touch()
    status = client.wait(run_id, timeout=20)
    assert status.status == "done", status
    assert status.final_text == "You said: first"
    assert kinds(client, run_id).count("answered") == 1
    answered = [e for e in client.events(run_id) if e.kind == "answered"]
    assert answered[0].content == "first"


def test_an_answer_sent_before_the_run_parks_is_kept_and_used(
    client: Client, tmp_path: Path
) -> None:
    # a tool that holds the run until the test opens its gate, then the question
    gate = tmp_path / "open"
    run_id = client.enqueue(spec("gated_ask", str(gate)))
    client.answer(run_id, "early")
    client.answer(run_id, "later")  # the first answer sent wins, the run not parked yet
    assert client.status(run_id).status in ("queued", "running")
    gate.touch()
    status = client.wait(run_id, timeout=20)
    assert status.status == "done", status
    assert status.final_text == "You said: early"
    assert kinds(client, run_id) == [
        "queued",
        "model",
        "tool",
        "model",
        "parked",
        "answered",
        "resumed",
        "model",
        "finished",
    ]


def test_a_late_duplicate_pinned_to_its_question_does_not_answer_the_next_one(
    client: Client,
) -> None:
    run_id = client.enqueue(spec("ask2"))
    first = client.wait(run_id, timeout=20)
    client.answer(run_id, "Shot 3", segment=first.segment)
    second = client.wait(run_id, timeout=20)
    assert second.asked == {"question": "Question 2?"} and second.segment == 1
    # a double click, after the run moved on
    client.answer(run_id, "Shot 3", segment=first.segment)
    # still waiting for its own answer
    assert client.wait(run_id, timeout=20).status == "asked"
    client.answer(run_id, "Shot 5")
    status = client.wait(run_id, timeout=20)
    assert status.final_text == "You said: Shot 3, then Shot 5", status
    assert kinds(client, run_id).count("answered") == 2
