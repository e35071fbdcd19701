"""`workers.client.ops.decision_states`: where each decision of a run stands, from what Redis holds (the
held calls, recorded decisions, the inbox of decisions not applied yet, the workers' refusals)."""

from __future__ import annotations

import json

from workers.client.ops import decision_states

HELD = [
    {"call_id": "a", "name": "send_cut"},
    {"call_id": "b", "name": "send_cut"},
    {"call_id": "c", "name": "send_cut"},
    {"call_id": "d", "name": "send_cut"},
]


def test_queued_beats_recorded_beats_refused_beats_pending() -> None:
    recorded = {
        "s1:a": json.dumps({"action": "reject", "reason": "no", "actor": "ana"}),
        "s1:d": json.dumps({"action": "reject", "actor": "deadline"}),
        "s0:old": json.dumps({"action": "approve"}),
    }
    inbox = {
        "x1": json.dumps(
            {
                "call_id": "b",
                "decision": {"action": "approve", "actor": "bo"},
                "at": 5.0,
            }
        )
    }
    outcomes = {
        "x0": json.dumps(
            {
                "call_id": "c",
                "outcome": "refused",
                "why": "Input should be a number",
                "at": 1.0,
            }
        ),
        "x2": json.dumps(
            {"call_id": "a", "outcome": "refused", "why": "stale", "at": 0.5}
        ),
    }
    found = decision_states("r", 1, HELD, recorded, inbox, outcomes)
    assert (
        found["a"].state,
        found["a"].action,
        found["a"].actor,
        found["a"].reason,
    ) == (
        "decided",
        "reject",
        "ana",
        "no",
    )
    assert (found["b"].state, found["b"].action, found["b"].actor) == (
        "queued",
        "approve",
        "bo",
    )
    assert (found["c"].state, found["c"].why) == ("refused", "Input should be a number")
    assert (found["d"].state, found["d"].action) == ("expired", "reject")
    assert found["old"].state == "decided"  # the segment before: the run resumed since
    # older segments are forgotten
    assert decision_states("r", 3, [], recorded, {}, {}) == {}
    assert decision_states("r", 0, HELD[:1], {}, {}, {})["a"].state == "pending"
