"""Cancel, budget and failure: each stop leaves a valid history, a final state and its events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.runs_kit import client_on, eventually, kinds, logged, spec
from toolloop import AssistantMessage, TextPart, ToolMessage, UserMessage
from workers.client import Client
from workers.protocol.errors import RunStateError


@pytest.fixture
def client(runs_redis, worker) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    yield from client_on(runs_redis)


def test_a_cancel_stops_the_slow_step_in_flight(client: Client, worker) -> None:  # type: ignore[no-untyped-def]
    starts_before = sum(1 for e in logged(worker.tool_log) if e.get("event") == "start")
    run_id = client.enqueue(spec("slow"))
    eventually(
        lambda: (
            sum(1 for e in logged(worker.tool_log) if e.get("event") == "start")
            > starts_before
        )
    )
    client.cancel(run_id)
    # the tool would sleep 30 s without the abort
    status = client.wait(run_id, timeout=10)
    assert status.status == "cancel"
    assert status.cancel_requested

    history = client.history(run_id)
    assert [type(m) for m in history] == [
        UserMessage,
        AssistantMessage,
        ToolMessage,
        ToolMessage,
    ]
    # the slow tool saw the abort
    assert history[2].content == [TextPart(text="stopped early")]
    assert history[3].content == "Not run: cancel."  # the call after it never ran
    assert kinds(client, run_id) == ["queued", "model", "tool", "finished"]
    assert [e for e in client.events(run_id)][-1].stopped_by == "cancel"


def test_a_cancel_of_a_parked_run_ends_it(client: Client) -> None:
    run_id = client.enqueue(spec("ask"))
    assert client.wait(run_id, timeout=20).status == "asked"
    client.cancel(run_id)
    status = client.wait(run_id, timeout=20)
    assert status.status == "cancel"
    history = client.history(run_id)
    assert history[-1] == ToolMessage(
        tool_call_id=history[1].tool_calls[0].id, content="Not run: cancel."
    )  # type: ignore[union-attr]
    assert kinds(client, run_id)[-4:] == ["parked", "answered", "resumed", "finished"]


def test_a_cancel_that_lands_while_the_run_is_parking_ends_it(client: Client) -> None:
    """The cancel mark is there, but its live step never heard it (a missed pubsub message): the park
    commit itself answers the question `Not run: cancel.` and the run ends as cancelled."""
    run_id = client.enqueue(spec("slow_model_ask"))
    eventually(lambda: client.status(run_id).status == "running")
    client.redis.hset(f"tl:{{{run_id}}}:state", "cancel", "1")  # marked, not published
    status = client.wait(run_id, timeout=20)
    assert status.status == "cancel", status
    history = client.history(run_id)
    assert history[-1] == ToolMessage(
        tool_call_id=history[1].tool_calls[0].id, content="Not run: cancel."
    )  # type: ignore[union-attr]
    assert kinds(client, run_id) == [
        "queued",
        "model",
        "parked",
        "answered",
        "resumed",
        "finished",
    ]


def test_the_budget_stops_the_run_before_the_model_call_that_would_pass_it(
    client: Client,
) -> None:
    run_id = client.enqueue(spec("budget", budget_usd=1.0))  # each model call costs 0.4
    status = client.wait(run_id, timeout=20)
    assert status.status == "budget"
    assert status.steps == 3
    assert status.spent_usd == pytest.approx(1.2)
    assert kinds(client, run_id) == ["queued"] + ["model", "tool"] * 3 + [
        "budget",
        "finished",
    ]
    history = client.history(run_id)  # every call answered: a history to resume from
    assert [type(m) for m in history] == [UserMessage] + [
        AssistantMessage,
        ToolMessage,
    ] * 3
    budget = next(e for e in client.events(run_id) if e.kind == "budget")
    assert (budget.mode, budget.spent_usd, budget.limit_usd) == (
        "stop",
        pytest.approx(1.2),
        1.0,
    )


def test_outside_spend_counts_against_the_budget(client: Client) -> None:
    run_id = client.enqueue(spec("budget", budget_usd=1.0))
    client.add_spend(run_id, 0.7)  # billed while the first tool still sleeps
    status = client.wait(run_id, timeout=20)
    assert status.status == "budget"
    assert status.steps == 1
    assert status.spent_usd == pytest.approx(1.1)


def test_a_failed_run_keeps_its_journal_and_a_retry_finishes_it(
    client: Client,
    worker,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    flag = tmp_path / "flag"
    run_id = client.enqueue(spec("flaky", user=str(flag)))
    failed = client.wait(run_id, timeout=20)
    assert failed.status == "failed"
    assert failed.error_class == "RuntimeError"
    assert failed.error_message == f"flaky: {flag} does not exist yet"
    assert kinds(client, run_id) == ["queued", "model", "failed"]

    flag.touch()
    client.retry(run_id)
    status = client.wait(run_id, timeout=20)
    assert status.status == "done" and status.final_text == "Found it."
    assert status.error_class is None
    history = client.history(run_id)
    assert [type(m) for m in history] == [
        UserMessage,
        AssistantMessage,
        ToolMessage,
        AssistantMessage,
    ]
    assert history[2].content == [TextPart(text="the file is there")]
    assert kinds(client, run_id) == [
        "queued",
        "model",
        "failed",
        "queued",
        "tool",
        "model",
        "finished",
    ]
    queued = [e.data for e in client.events(run_id) if e.kind == "queued"]
    # the retry's event says model and toolset too
    assert queued[1] == {
        **queued[0],
        "retry": True,
    }
    assert queued[1]["model"] == "scripted" and queued[1]["toolset"] == "agents"
    model_calls = [e for e in logged(worker.model_log) if e["user"] == str(flag)]
    # the first model call replayed from the journal on retry
    assert len(model_calls) == 2
    with pytest.raises(RunStateError, match="only a failed run can be retried"):
        client.retry(run_id)
