"""The client side of follow-ups, steers and interrupts (workers/client/talk.py): bad input is refused before
anything is sent, and a worker's segment span names a follow-up and its steers (workers/step/steering.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workers.client import talk
from workers.client.ops import Sender
from workers.step.steering import talk_attributes


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"add_budget_usd": -1.0}, "add_budget_usd must be 0 or more"),
        ({"add_budget_usd": float("nan")}, "add_budget_usd must be 0 or more"),
        ({"add_budget_usd": "1"}, "add_budget_usd must be a number"),
        ({"add_max_steps": 1.5}, "add_max_steps must be a whole number"),
        ({"add_max_steps": True}, "add_max_steps must be a whole number"),
        ({"idempotency_key": ""}, "An idempotency key is a string of 1 to 200"),
        ({"idempotency_key": "k" * 201}, "An idempotency key is a string of 1 to 200"),
    ],
)
def test_a_bad_follow_up_is_refused_before_any_request(
    options: dict[str, object], said: str
) -> None:
    op = talk.send(Sender(0), "run", "hello", **options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=said):
        next(op)


@pytest.mark.parametrize("text", ["", "   ", None])
def test_an_empty_message_is_refused(text: object) -> None:
    with pytest.raises(ValueError, match="needs some text"):
        next(talk.send(Sender(0), "run", text))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs some text"):
        next(talk.steer("run", text))  # type: ignore[arg-type]


@pytest.mark.parametrize("steer_id", ["", "a b", "x" * 65, "../x", "steer:1"])
def test_a_steer_id_is_a_short_plain_name(steer_id: str) -> None:
    with pytest.raises(ValueError, match="A steer id is 1 to 64 letters"):
        next(talk.steer("run", "look", steer_id))


def test_the_segment_span_names_a_follow_up_and_its_steers() -> None:
    live = SimpleNamespace(
        journal=SimpleNamespace(entries={"model:1": "", "steer:a": "", "steer:b": ""})
    )
    step = SimpleNamespace(live=live, state={"follow_up_segment": "2"}, segment=2)
    assert talk_attributes(step) == {"toolloop.steers": 2, "toolloop.follow_up": True}  # type: ignore[arg-type]
    step.segment = 3
    assert talk_attributes(step) == {"toolloop.steers": 2}  # type: ignore[arg-type]


def test_toolloop_events_names_follow_ups_and_steers() -> None:
    from toolloop.cli.render import talk_text

    assert (
        talk_text("follow_up", {"content": "And shot 5?"}) == "follow-up: And shot 5?"
    )
    assert talk_text("steer_sent", {"steer_id": "s1", "seq": 1}).startswith(
        "steer sent (s1)"
    )
    taken = talk_text(
        "steer", {"step": 3, "id_": "s1", "content": "Look at the config."}
    )
    assert taken == "steer taken before model turn 3: Look at the config."


def test_a_steer_step_runs_on_llm_and_flower_shows_it_as_steer() -> None:
    from workers.observe.metrics import kind_of
    from workers.step import routing

    assert routing.route(None, "steer:abc") == "llm"
    # the task's kwargsrepr: Flower's row
    assert routing.describe(None, "steer:abc") == "steer"
    assert kind_of("steer:abc") == "steer"  # the `kind` label of the step metrics
