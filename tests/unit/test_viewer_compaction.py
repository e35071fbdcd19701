"""The run viewer (examples/viewer.py) marks where a compaction happened: a `compaction` event is a
row of the steps table, between the model rows, without shifting their numbers (docs/context.md)."""

from __future__ import annotations

from examples import viewer
from toolloop import CompactionEvent, ModelEvent, PromptGenUsage


def test_a_compaction_event_is_a_row_of_the_steps_table() -> None:
    model = ModelEvent(
        step=1, text="Reading.", cost_usd=0.01, usage=PromptGenUsage(prompt_tokens=900)
    )
    compaction = CompactionEvent(
        step=2, covered_turns=1, cost_usd=0.002, input_tokens=151_000
    )
    events = [
        {"kind": "queued", "model": "m", "budget_usd": 1.0, "id": "1-0"},
        {**model.model_dump(mode="json"), "id": "2-0"},
        {**compaction.model_dump(mode="json"), "id": "3-0"},
        {**model.model_copy(update={"step": 2}).model_dump(mode="json"), "id": "4-0"},
    ]
    html = viewer.page("r1", {"status": "running", "spent_usd": 0.022}, events, [])
    rows = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    assert (
        rows.count('<tr class="model">') == 2
        and rows.count('<tr class="compaction">') == 1
    )
    assert rows.index("model 1") < rows.index("compaction") < rows.index("model 2")
    assert "151,000" in rows and "turns 1-1 summarized" in rows and "$0.0020" in rows
    assert "compaction: (d) =>" in html  # the live stream adds the same row
