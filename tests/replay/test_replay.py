"""Committed golden journals replay to the same requests, history and events (STYLE: tests/replay).

A change in the loop that alters a golden file must say why in its commit; regenerate the files with
`.venv/bin/python tests/replay/scenarios.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scenarios import GOLDEN, SCENARIOS, build_options, record, tools

from toolloop import LoopEvent, MemoryJournal, PromptGenRequest, run_tool_loop

FILES = sorted(GOLDEN.glob("*.json"))


class Exploding:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, *args: Any) -> Any:
        self.calls += 1
        raise AssertionError("a replay called the model or a tool")


class Captured(Exception):
    pass


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def journal_of(entries: list[list[Any]]) -> MemoryJournal:
    return MemoryJournal(entries={key: json.dumps(stored) for key, stored in entries})


def test_every_scenario_has_a_golden_file() -> None:
    assert sorted(p.stem for p in FILES) == sorted(SCENARIOS)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
async def test_full_replay_makes_no_call_and_gives_the_same_result_and_events(
    path: Path,
) -> None:
    golden = load(path)
    explode = Exploding()
    events: list[LoopEvent] = []
    summary = golden["options"]
    opts = build_options(
        summary,
        explode,
        journal_of(golden["journal"]),
        events.append,
        tools(summary["tools"], False, explode),
    )
    result = await run_tool_loop(opts)
    assert explode.calls == 0
    assert result.model_dump(mode="json") == golden["result"]
    assert [e.model_dump(mode="json") for e in events] == golden["events"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
async def test_replay_up_to_each_model_step_sends_the_same_request(path: Path) -> None:
    golden = load(path)
    summary = golden["options"]
    keys = [key for key, _ in golden["journal"]]
    seen: list[PromptGenRequest] = []

    async def capture(request: PromptGenRequest, signal: Any) -> Any:
        seen.append(request)
        raise Captured

    for index, expected in enumerate(golden["requests"]):
        cut = keys.index(f"model:{index + 1}")
        seen.clear()
        explode = Exploding()
        journal = journal_of(golden["journal"][:cut])
        with pytest.raises(Captured):
            await run_tool_loop(
                build_options(
                    summary,
                    capture,
                    journal,
                    None,
                    tools(summary["tools"], False, explode),
                )
            )
        assert explode.calls == 0
        assert seen[0].model_dump(mode="json") == expected, (
            f"request {index + 1} of {path.stem}"
        )


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
async def test_a_live_run_still_writes_the_golden_journal(path: Path) -> None:
    assert await record(path.stem) == load(path)
