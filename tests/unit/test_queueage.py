"""workers/observe/queueage.py: the age of a queue's oldest waiting message from its `sent_at` header,
and from the first scrape that saw it when the header is missing or not a time (nothing in a message
runs)."""

from __future__ import annotations

import json

import pytest

from workers.observe.queueage import OldestWaiting, sent_at
from workers.protocol import wire


def message(when: object = None, drop: bool = False) -> str:
    made = json.loads(wire.task_message("toolloop.advance", ["r", 1], "r:1", "llm").raw)
    if drop:
        del made["headers"]["sent_at"]
    elif when is not None:
        made["headers"]["sent_at"] = when
    return json.dumps(made)


def test_a_task_message_carries_the_time_it_was_sent() -> None:
    assert sent_at(message(1_000.5)) == 1_000.5
    assert sent_at(message(1_000.5).encode()) == 1_000.5


@pytest.mark.parametrize(
    "raw",
    [
        message(drop=True),
        message(True),
        message("1000"),
        message(-5),
        message([1]),
        "not json",
        "[1, 2]",
        '{"headers": 7}',
        '{"headers": {"sent_at": 1e400}}',
        '{"headers": {"sent_at": NaN}}',
    ],
    ids=[
        "no sent_at",
        "sent_at true",
        "sent_at a string",
        "sent_at negative",
        "sent_at a list",
        "not json",
        "not an object",
        "headers not an object",
        "sent_at infinite",
        "sent_at NaN",
    ],
)
def test_a_message_without_a_usable_time_has_none(raw: str) -> None:
    assert sent_at(raw) is None


def test_the_age_is_the_oldest_next_message_of_the_queues_lists() -> None:
    oldest = OldestWaiting(None, ["llm", "tools"])
    ages = oldest.ages(
        {"llm": message(100.0), "llm\x06\x163": message(90.0), "tools": None}, now=130.0
    )
    assert ages == {"llm": 40.0, "tools": 0.0}


def test_a_message_without_a_time_ages_from_the_first_scrape_that_saw_it() -> None:
    oldest = OldestWaiting(None, ["llm"])
    legacy, future = message(drop=True), message(10.0**12)
    assert oldest.ages({"llm": legacy}, now=100.0) == {"llm": 0.0}
    assert oldest.ages({"llm": legacy}, now=103.0) == {"llm": 3.0}
    # another message: seen from now
    assert oldest.ages({"llm": future}, now=104.0) == {"llm": 0.0}
    assert oldest.ages({"llm": future}, now=106.0) == {"llm": 2.0}
    assert oldest.ages({"llm": None}, now=107.0) == {"llm": 0.0}
    # gone and back: a new sighting
    assert oldest.ages({"llm": legacy}, now=108.0) == {"llm": 0.0}
