"""What the storyboard-review agent is told: its system text and the director's request.

The system text lives in brief.md (`toolloop run --system @examples/storyboard/brief.md` reads it). It
is long on purpose, as real review briefs are: it is the part of every request the prompt cache serves
from the second call on (the demo prints how much that saved).
"""

from __future__ import annotations

from pathlib import Path

TOOLSET = "review"
"""The name the demo registers the toolset under (TOOLLOOP_TOOLSETS="review=...")."""
TOOLSET_PATH = "examples.storyboard.tools:REVIEW_TOOLS"
MODEL = "claude-sonnet-5-5"

PROMPT = (
    "The rough cut of the rooftop sequence runs long. Review the six shots against the board, look at "
    "the frames that matter, render a preview of your proposed cut, and tell me what to change."
)

SYSTEM = (Path(__file__).parent / "brief.md").read_text()
