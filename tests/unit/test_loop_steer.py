"""Steering in the loop (SPEC 6.1): `RunToolLoopOptions.steers`, journaled as `steer:<id>` steps."""

from __future__ import annotations

from loop_kit import Exploding, read_frame, run

from toolloop import AssistantMessage, MemoryJournal, ToolMessage, UserMessage
from toolloop.loop.types import Steer
from toolloop.testing import ScriptedModel, call, reply


class Inbox:
    """Steers that arrive when the model has been called `after` times; each given until taken."""

    def __init__(self, model: ScriptedModel, arrivals: dict[int, list[Steer]]) -> None:
        self.model = model
        self.arrivals = arrivals
        self.asked: list[int] = []

    async def __call__(self, turn: int, ending: bool) -> list[Steer]:
        self.asked.append(turn)
        return [
            s
            for after, steers in self.arrivals.items()
            if self.model.calls >= after
            for s in steers
        ]


async def test_a_steer_joins_the_next_request_after_the_tool_results_once() -> None:
    model = ScriptedModel(
        [
            reply(tool_calls=[call("read_frame", {"shot": 3}, id="c1")]),
            reply("Looked at the config."),
        ]
    )
    inbox = Inbox(model, {1: [Steer(id="a", content="Look at the config instead.")]})
    journal = MemoryJournal()
    result, events = await run(model, journal, steers=inbox)
    assert result.stopped_by == "done"
    second = model.requests[1].messages
    assert [type(m) for m in second] == [
        UserMessage,
        AssistantMessage,
        ToolMessage,
        UserMessage,
    ]
    assert second[-1].content[0].text == "Look at the config instead."  # type: ignore[union-attr]
    assert second[-1].content[0].cache  # the rolling mark moves onto it (SPEC 2.9)  # type: ignore[union-attr]
    assert journal.keys().count("steer:a") == 1
    assert events.kinds() == ["model", "tool", "steer", "model"]
    texts = [m.content for m in result.messages if isinstance(m, UserMessage)]
    assert texts.count("Look at the config instead.") == 1


async def test_a_steer_that_comes_as_the_model_finishes_gets_its_own_answer() -> None:
    model = ScriptedModel([reply("Done."), reply("Sure, the config too.")])
    inbox = Inbox(model, {1: [Steer(id="late", content="Also check the config.")]})
    result, events = await run(model, steers=inbox)
    assert result.stopped_by == "done"
    assert result.final_text == "Sure, the config too."
    assert model.calls == 2
    assert events.kinds() == ["model", "steer", "model"]


async def test_a_replay_takes_the_journaled_steer_at_the_same_place_and_asks_nothing() -> (
    None
):
    model = ScriptedModel(
        [
            reply(tool_calls=[call("read_frame", {"shot": 3}, id="c1")]),
            reply("Config read."),
        ]
    )
    journal = MemoryJournal()
    inbox = Inbox(model, {1: [Steer(id="a", content="Read the config.")]})
    first, _ = await run(model, journal, tools=[read_frame()], steers=inbox)

    async def replayed(
        turn: int, ending: bool
    ) -> list[Steer]:  # what a durable journal gives back on replay
        return [Steer(id="a", content="Read the config.")] if turn == 2 else []

    again, events = await run(
        Exploding(), journal, tools=[read_frame()], steers=replayed
    )
    assert again.messages == first.messages
    assert events.kinds() == ["model", "tool", "steer", "model"]


async def test_no_steer_is_taken_when_no_model_call_could_follow() -> None:
    model = ScriptedModel([reply("Done.")])
    inbox = Inbox(model, {1: [Steer(id="a", content="More.")]})
    result, events = await run(model, max_steps=1, steers=inbox)
    assert result.stopped_by == "done"
    assert events.kinds() == ["model"]
