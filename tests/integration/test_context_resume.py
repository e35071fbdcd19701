"""A compacting durable run parked on `ask` and resumed with the answer does not compact again
(docs/context.md, "Across segments"): the compaction made before the park is carried into the next
segment, so its first request is the compacted one and the simulator sees no extra summary call.

Real Redis, a real worker, the simulator over HTTP on the Anthropic wire (the model and the
summary calls both go through it; it counts each summary request in `stats()["compactions"]`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import Worker
from tests.integration.runs_kit import spec
from tests.support.sim import Recording
from toolloop.embedded import EmbeddedServer
from toolloop.journal.keys import journal
from toolloop.loop.context import SUMMARY_HEADER
from toolloop.sim import SimServer
from workers.client import Client

NOTE = (
    "the framing holds, the key light stays left, the eyeline matches the reverse; "
    * 20
)
"""About 400 tokens of text per turn: three turns pass the threshold below."""

SCRIPT: list[dict[str, Any]] = [
    {
        "text": f"One. {NOTE}",
        "tool_calls": [{"name": "add", "input": {"a": 1, "b": 1}}],
    },
    {
        "text": f"Two. {NOTE}",
        "tool_calls": [{"name": "add", "input": {"a": 2, "b": 2}}],
    },
    {
        "text": f"Three. {NOTE}",
        "tool_calls": [{"name": "add", "input": {"a": 3, "b": 3}}],
    },
    {
        "text": "A question.",
        "tool_calls": [{"name": "ask", "input": {"question": "Which shot?"}}],
    },
    {"text": "Done: shot 3."},
]
CONTEXT = {"compact_at_tokens": 1200, "keep_turns": 1}


@pytest.fixture(scope="module")
def policy() -> Recording:
    return Recording(SCRIPT)


@pytest.fixture(scope="module")
def sim(policy: Recording) -> Iterator[SimServer]:
    with SimServer(policy) as server:
        yield server


def _compactions(sim: SimServer) -> int:
    return sum(sim.stats()["compactions"].values())


def _first_text(body: dict[str, Any]) -> str:
    first = body["messages"][0]["content"]
    if isinstance(first, str):
        return first
    return " ".join(block.get("text", "") for block in first)


def test_a_run_resumed_after_an_ask_does_not_compact_again(
    sim_redis: EmbeddedServer, sim: SimServer, sim_worker: Worker, policy: Recording
) -> None:
    client = Client(sim_redis.url)
    try:
        run_id = client.enqueue(
            spec(
                "You review shots.",
                model="claude-sonnet-5-5",
                provider="anthropic",
                context=CONTEXT,
                max_steps=10,
            )
        )
        parked = client.wait(run_id, timeout=60)
        assert parked.status == "asked", parked
        before = _compactions(sim)
        assert before >= 1, "the run compacted before it parked"
        requests_before = len(policy.bodies)

        client.answer(run_id, "Shot 3")
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", status
        assert status.final_text == "Done: shot 3."
        # no summary call after the resume: the simulator saw exactly the ones before the park
        assert _compactions(sim) == before
        compacted = [e for e in client.events(run_id) if e.kind == "compaction"]
        assert len(compacted) == before
        # the resumed segment's one model request is the compacted one: the summary, then the
        # turns from the cut on (not the whole history again)
        after = policy.bodies[requests_before:]
        assert len(after) == 1, [_first_text(b)[:80] for b in after]
        head = SUMMARY_HEADER.split("{turns}")[0]
        assert head in _first_text(after[0])
        assert len(after[0]["messages"]) < len(client.history(run_id))
    finally:
        client.close()


def test_a_durable_run_counts_each_near_request_once_in_its_journal(
    sim_redis: EmbeddedServer, sim: SimServer, sim_worker: Worker
) -> None:
    """With `count_margin=1.0` every turn is near: each model turn of both segments is counted by
    the provider once, as a `count:<n>` step of its segment's journal, one count request each."""
    client = Client(sim_redis.url)
    try:
        before = sum(sim.stats()["counted"].values())
        run_id = client.enqueue(
            spec(
                "You review shots, counting.",
                model="claude-sonnet-5-5",
                provider="anthropic",
                context={**CONTEXT, "count_margin": 1.0},
                max_steps=10,
            )
        )
        assert client.wait(run_id, timeout=60).status == "asked"
        client.answer(run_id, "Shot 3")
        assert client.wait(run_id, timeout=60).status == "done"
        counts = [
            key
            for segment in ("s0", "s1")
            for key in client.redis.hkeys(journal(run_id, segment))
            if key.startswith("count:")
        ]
        assert len(counts) >= 4, counts
        assert sum(sim.stats()["counted"].values()) - before == len(counts)
    finally:
        client.close()


def test_a_follow_up_after_a_compacted_run_ends_does_not_compact_again(
    sim_redis: EmbeddedServer, sim: SimServer, sim_worker: Worker, policy: Recording
) -> None:
    """The same for a follow-up (`send`) to a run that ended `done`: the stop's commit keeps the
    compaction for the next segment."""
    client = Client(sim_redis.url)
    try:
        run_id = client.enqueue(
            spec(
                "You review shots, then more.",
                model="claude-sonnet-5-5",
                provider="anthropic",
                context=CONTEXT,
                max_steps=10,
            )
        )
        assert client.wait(run_id, timeout=60).status == "asked"
        client.answer(run_id, "Shot 3")
        assert client.wait(run_id, timeout=60).status == "done"
        made = _compactions(sim)
        requests_before = len(policy.bodies)

        client.send(run_id, "And the reverse shot?")
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", status
        assert status.segment == 2
        assert _compactions(sim) == made
        after = policy.bodies[requests_before:]
        assert len(after) == 1
        assert SUMMARY_HEADER.split("{turns}")[0] in _first_text(after[0])
    finally:
        client.close()
