"""workers/wire.py: a task message the step consumer writes reads back as the same delivery, and
the unacked value it records is what kombu's restore parses ([message, exchange, routing key])."""

from __future__ import annotations

import json

from workers import wire


def test_a_task_message_parses_back_to_the_delivery_it_was_made_as() -> None:
    made = wire.task_message("toolloop.advance", ["run1", 3], "run1:3", "tools")
    assert wire.parse(made.raw) == made
    assert (made.name, made.task_id, made.args) == ("toolloop.advance", "run1:3", ["run1", 3])
    assert wire.tag_of(made.raw) == made.tag
    assert wire.task_message("toolloop.advance", ["run1", 3], "run1:3", "tools").tag != made.tag


def test_the_unacked_value_is_kombus_triple() -> None:
    made = wire.task_message("toolloop.advance", ["run1", 3], "run1:3", "llm")
    message, exchange, routing_key = json.loads(wire.unacked_value(made.raw, "llm"))
    assert (message, exchange, routing_key) == (json.loads(made.raw), "", "llm")
    assert message["properties"]["delivery_info"] == {"exchange": "", "routing_key": "llm"}
