"""A durable run with a tool, end to end: a real worker process, a private Redis, the client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.runs_kit import client_on
from toolloop import AssistantMessage, ToolMessage, UserMessage
from workers.client import Client
from workers.protocol.errors import RunNotFoundError, RunStateError

TOOLSET = "agents"


def logged(path: Path | None) -> list[dict[str, object]]:
    assert path is not None
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def client(runs_redis) -> Client:  # type: ignore[no-untyped-def]
    yield from client_on(runs_redis)


def test_a_run_with_a_tool_reaches_done(client: Client, worker) -> None:  # type: ignore[no-untyped-def]
    run_id = client.enqueue(
        {
            "model": "scripted",
            "system": "tools",
            "toolset": TOOLSET,
            "messages": [{"role": "user", "content": "Add 2 and 3."}],
        }
    )
    status = client.wait(run_id, timeout=30)
    assert status.status == "done", status
    assert status.final_text == "The sum is 5."
    assert status.steps == 2
    assert status.spent_usd == pytest.approx(0.02)

    history = client.history(run_id)
    assert [type(m) for m in history] == [
        UserMessage,
        AssistantMessage,
        ToolMessage,
        AssistantMessage,
    ]
    assert history[2].content[0].text == "5"  # type: ignore[union-attr]

    events = list(client.events(run_id))
    assert [e.kind for e in events] == ["queued", "model", "tool", "model", "finished"]
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert events[2].name == "add" and events[2].summary == "5"
    assert events[-1].stopped_by == "done"
    assert [
        e["tool"] for e in logged(worker.tool_log) if (e.get("a"), e.get("b")) == (2, 3)
    ] == ["add"]
    with pytest.raises(
        RunStateError, match="has ended \\(done\\); there is nothing to cancel"
    ):
        client.cancel(run_id)  # too late: refused, and the run stays as it ended
    assert (client.status(run_id).status, client.status(run_id).cancel_requested) == (
        "done",
        False,
    )


def test_a_bad_spec_or_an_unknown_toolset_enqueues_nothing(client: Client) -> None:
    import pydantic

    from workers.protocol.errors import ToolsetError

    before = client.redis.zcard("tl:runs:live")
    with pytest.raises(pydantic.ValidationError):
        client.enqueue({"model": "scripted", "messages": []})
    with pytest.raises(
        ToolsetError, match=r"'tests\.integration\.nowhere:TOOLS' is not registered"
    ):
        client.enqueue(
            {
                "model": "m",
                "toolset": "tests.integration.nowhere:TOOLS",
                "messages": [{"role": "user", "content": "hi"}],
            }
        )
    assert client.redis.zcard("tl:runs:live") == before


def test_an_unknown_run_id_is_a_clear_error(client: Client) -> None:
    with pytest.raises(RunNotFoundError, match="No run has the id 'nope'"):
        client.status("nope")


def test_events_follow_a_run_to_its_end_and_resume_after_an_id(
    client: Client, worker
) -> None:  # type: ignore[no-untyped-def]
    run_id = client.enqueue(
        {
            "model": "scripted",
            "system": "tools",
            "toolset": TOOLSET,
            "messages": [{"role": "user", "content": "Add 7 and 8."}],
        }
    )
    # blocks until the terminal event
    followed = list(client.events(run_id, follow=True))
    assert [e.kind for e in followed] == [
        "queued",
        "model",
        "tool",
        "model",
        "finished",
    ]
    rest = list(client.events(run_id, after=followed[1].id))
    assert [e.seq for e in rest] == [3, 4, 5]
    assert list(client.events(run_id, after=followed[-1].id, block_ms=200)) == []
