"""Talking to a durable run (SPEC 6.1, docs/conversations.md): follow-ups, steers and interrupts,
with a real worker process, a private Redis and the simulator over HTTP (counted at the simulator)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from bench._chat import Chat, between_call_and_result, text_of
from tests.integration.conftest import Worker
from tests.integration.runs_kit import eventually, kinds
from toolloop import UserMessage
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol.errors import RunStateError

MODEL = "claude-sonnet-5-5"


@pytest.fixture(scope="module")
def policy() -> Chat:
    return Chat()


@pytest.fixture(scope="module")
def sim(policy: Chat) -> Iterator[SimServer]:
    with SimServer(policy) as server:
        yield server


@pytest.fixture
def client(sim_redis: EmbeddedServer, sim_worker: Worker) -> Iterator[Client]:
    made = Client(sim_redis.url)
    yield made
    made.close()


def chat_spec(first: str, **fields: object) -> dict[str, object]:
    return {
        "model": MODEL,
        "provider": "anthropic",
        "system": "You chat.",
        "toolset": "agents",
        "messages": [{"role": "user", "content": first}],
        **fields,
    }


def test_a_send_after_done_continues_the_run_with_its_history(
    client: Client, policy: Chat
) -> None:
    run_id = client.enqueue(chat_spec("hello"))
    assert client.wait(run_id, timeout=30).final_text == "echo: hello"
    sent = client.send(run_id, "and again")
    assert (sent.what, sent.segment) == ("continued", 1)
    status = client.wait(run_id, timeout=30)
    assert (status.status, status.final_text, status.steps, status.segment) == (
        "done",
        "echo: and again",
        2,
        1,
    )
    history = client.history(run_id)
    assert [(type(m).__name__, text_of(m)) for m in history] == [
        ("UserMessage", "hello"),
        ("AssistantMessage", "echo: hello"),
        ("UserMessage", "and again"),
        ("AssistantMessage", "echo: and again"),
    ]
    second = policy.carrying("and again")
    assert len(second) == 1 and [text_of(m) for m in second[0].messages][:2] == [
        "hello",
        "echo: hello",
    ]
    assert kinds(client, run_id) == [
        "queued",
        "model",
        "finished",
        "follow_up",
        "model",
        "finished",
    ]
    # the spend carries over
    assert status.spent_usd > client.status(run_id).spent_usd / 2 > 0


def test_a_send_to_a_failed_or_cancelled_run_is_refused(client: Client) -> None:
    run_id = client.enqueue(chat_spec("slow 5"))
    eventually(lambda: client.status(run_id).status == "running")
    client.cancel(run_id)
    assert client.wait(run_id, timeout=30).status == "cancel"
    with pytest.raises(
        RunStateError, match="was cancelled \\(cancel\\); it takes no follow-up"
    ):
        client.send(run_id, "more")
    failed = client.enqueue(chat_spec("fail"))
    assert client.wait(failed, timeout=30).status == "failed"
    with pytest.raises(
        RunStateError,
        match=r"(?s)ended 'failed'; only a run that ended `done`.*Retry it",
    ):
        client.send(failed, "more")
    steps = client.enqueue(chat_spec("slow 0.1", max_steps=1))
    assert client.wait(steps, timeout=30).status == "steps"
    with pytest.raises(RunStateError, match="ended 'steps'"):
        client.send(steps, "more", add_max_steps=5)
    assert client.status(steps).segment == 0  # nothing moved


def test_a_keyed_send_is_applied_once(client: Client, policy: Chat) -> None:
    run_id = client.enqueue(chat_spec("one"))
    client.wait(run_id, timeout=30)
    first = client.send(
        run_id, "two", idempotency_key="msg-2", add_budget_usd=1.0, add_max_steps=3
    )
    again = client.send(
        run_id, "two", idempotency_key="msg-2", add_budget_usd=1.0, add_max_steps=3
    )
    assert first == again
    client.wait(run_id, timeout=30)
    # after it ran, too
    assert client.send(run_id, "two", idempotency_key="msg-2") == first
    assert len(policy.carrying("two")) == 1
    assert [text_of(m) for m in client.history(run_id)].count("two") == 1
    state = client.redis.hmget(f"tl:{{{run_id}}}:state", "budget_added", "steps_added")
    assert [float(v) for v in state] == [1.0, 3.0]  # the top-ups were applied once


def test_a_send_to_a_running_run_says_to_steer_it(client: Client) -> None:
    run_id = client.enqueue(chat_spec("slow 3"))
    eventually(lambda: client.status(run_id).status == "running")
    with pytest.raises(
        RunStateError, match="is running; a follow-up continues a run that ended `done`"
    ):
        client.send(run_id, "now?")
    client.cancel(run_id)


def test_a_send_to_a_parked_run_is_its_answer(client: Client) -> None:
    run_id = client.enqueue(chat_spec("ask"))
    assert client.wait(run_id, timeout=30).status == "asked"
    sent = client.send(run_id, "the blue one")
    assert (sent.what, sent.segment) == ("answered", 1)
    assert client.wait(run_id, timeout=30).final_text == "tool done"


def test_a_steer_is_seen_by_exactly_one_model_request_after_the_tool_result(
    client: Client, policy: Chat
) -> None:
    run_id = client.enqueue(chat_spec("slow 1.5"))
    eventually(lambda: client.status(run_id).status == "running")
    steer_id = client.steer(run_id, "look at the config")
    status = client.wait(run_id, timeout=30)
    assert (status.status, status.final_text) == ("done", "echo: look at the config")
    assert len(policy.first_seen("look at the config")) == 1
    seen = policy.carrying("look at the config")
    assert len(seen) == 1 and not between_call_and_result(seen[0].messages)
    history = client.history(run_id)
    assert [type(m).__name__ for m in history] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
        "UserMessage",
        "AssistantMessage",
    ]
    events = list(client.events(run_id))
    assert [e.kind for e in events] == [
        "queued",
        "model",
        "steer_sent",
        "tool",
        "steer",
        "model",
        "finished",
    ]
    # the steer event carries its id (`id` is the stream entry's)
    assert events[4].id_ == steer_id
    journal = client.redis.hkeys(f"tl:{{{run_id}}}:journal:s0")
    assert f"steer:{steer_id}" in journal
    with pytest.raises(
        RunStateError, match="has ended \\(done\\); a steer reaches a running run only"
    ):
        client.steer(run_id, "too late")


def test_a_steer_that_comes_as_the_model_finishes_is_answered(
    client: Client, policy: Chat
) -> None:
    run_id = client.enqueue(chat_spec("slow 1"))
    eventually(lambda: client.status(run_id).status == "running")
    client.steer(run_id, "first")
    client.steer(run_id, "second")
    status = client.wait(run_id, timeout=30)
    assert status.status == "done"
    texts = [text_of(m) for m in client.history(run_id) if isinstance(m, UserMessage)]
    # in the order they were sent, each once
    assert texts == [
        "slow 1",
        "first",
        "second",
    ]
    assert (
        len(policy.first_seen("first")) == 1 and len(policy.first_seen("second")) == 1
    )


def test_interrupt_stops_the_model_call_in_flight_then_a_send_continues(
    client: Client, policy: Chat
) -> None:
    run_id = client.enqueue(chat_spec("think 30"))
    eventually(lambda: policy.carrying("think 30"))  # the model call is in flight
    began = time.monotonic()
    client.interrupt(run_id)
    status = client.wait(run_id, timeout=10)
    assert status.status == "interrupted" and time.monotonic() - began < 10
    # nothing of the call is kept
    assert [text_of(m) for m in client.history(run_id)] == ["think 30"]
    assert list(client.events(run_id))[-1].stopped_by == "interrupted"
    sent = client.send(run_id, "never mind, say hi")
    assert sent.segment == 1
    status = client.wait(run_id, timeout=30)
    assert (status.status, status.final_text) == ("done", "echo: never mind, say hi")
    assert [text_of(m) for m in client.history(run_id)] == [
        "think 30",
        "never mind, say hi",
        status.final_text,
    ]
    with pytest.raises(
        RunStateError, match="only a queued or running run can be interrupted"
    ):
        client.interrupt(run_id)


def test_interrupt_stops_a_tool_in_flight_and_keeps_its_turn(client: Client) -> None:
    run_id = client.enqueue(chat_spec("slow 20"))
    eventually(lambda: client.status(run_id).steps == 1)  # the slow tool runs
    client.interrupt(run_id)
    assert client.wait(run_id, timeout=10).status == "interrupted"
    history = client.history(run_id)
    assert [type(m).__name__ for m in history] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
    ]
    client.send(run_id, "and now?")
    assert client.wait(run_id, timeout=30).final_text == "echo: and now?"
