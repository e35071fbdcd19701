"""MemoryJournal: the journal contract of SPEC 2.5 in a dict."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolloop import AbortController, AbortSignal, MemoryJournal, StepResult


def work_returning(value: Any, cost: float = 0.0, seen: list[Any] | None = None) -> Any:
    async def work(signal: AbortSignal) -> StepResult:
        if seen is not None:
            seen.append(signal)
        return StepResult(value=value, cost_usd=cost)

    return work


async def test_work_runs_once_per_key_and_the_stored_value_is_returned() -> None:
    journal = MemoryJournal()
    seen: list[Any] = []
    assert await journal.step("model:1", work_returning({"a": (1, 2)}, 0.5, seen)) == {
        "a": [1, 2]
    }
    assert await journal.step("model:1", work_returning("other", 0.0, seen)) == {
        "a": [1, 2]
    }
    assert len(seen) == 1
    assert json.loads(journal.entries["model:1"]) == {
        "value": {"a": [1, 2]},
        "cost_usd": 0.5,
    }


async def test_a_work_that_raises_stores_nothing_and_its_error_is_unchanged() -> None:
    journal = MemoryJournal()
    error = RuntimeError("model failed")

    async def failing(signal: AbortSignal) -> StepResult:
        raise error

    with pytest.raises(RuntimeError) as caught:
        await journal.step("model:1", failing)
    assert caught.value is error
    assert journal.keys() == []
    assert await journal.step("model:1", work_returning("second try")) == "second try"


@pytest.mark.parametrize("value", [object(), float("nan"), {"bytes": b"x"}])
async def test_values_that_would_not_survive_redis_fail_in_memory(value: Any) -> None:
    journal = MemoryJournal()
    with pytest.raises((TypeError, ValueError)):
        await journal.step("tool:c1", work_returning(value))
    assert journal.keys() == []


async def test_segments_share_entries_under_their_prefix_and_pass_the_signal() -> None:
    controller = AbortController()
    journal = MemoryJournal("s0/", signal=controller.signal)
    seen: list[Any] = []
    await journal.step("model:1", work_returning(1, seen=seen))
    later = journal.segment("s1/")
    assert await later.step("model:1", work_returning(2, seen=seen)) == 2
    assert journal.keys() == ["s0/model:1", "s1/model:1"]
    assert seen == [controller.signal, controller.signal]
