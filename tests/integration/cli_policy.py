"""The simulated model of tests/integration/test_cli.py: the storyboard review, plus a conversation
whose first request is refused (401, once), so the run fails and `toolloop retry` can finish it."""

from __future__ import annotations

from examples.storyboard.policy import review_policy
from toolloop import UserMessage
from toolloop.sim import SimFault, SimRequest, SimTurn

FAIL_ONCE = "Fail once, then answer."


def policy(request: SimRequest) -> SimTurn:
    first = request.messages[0]
    content = first.content if isinstance(first, UserMessage) else None
    text = (
        content
        if isinstance(content, str)
        else "".join(getattr(part, "text", "") for part in content or [])
    )
    if text == FAIL_ONCE:
        return SimTurn(
            text="Answered after a retry.",
            fault=SimFault(kind="error", status=401, times=1),
        )
    return review_policy(request)
