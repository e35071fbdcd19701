"""What `toolloop events` and the demo print for each event, and the cache savings they report."""

from __future__ import annotations

import io

import pytest

from toolloop import ModelEvent, PromptGenUsage, ToolCall, ToolEvent
from toolloop.cli.render import Progress, Totals, event_line


def model_event(step: int, read: int, write: int = 0) -> ModelEvent:
    usage = PromptGenUsage(
        prompt_tokens=2000,
        completion_tokens=50,
        cached_tokens=read,
        cache_write_tokens=write,
        cached_read_tokens=read,
        cached_write_tokens=write,
    )
    calls = [ToolCall(id="c1", name="read_frame", input={"shot": 3})]
    return ModelEvent(
        step=step, text=None, tool_calls=calls, cost_usd=0.0123, usage=usage
    )


def test_model_line_shows_tokens_cache_reads_cost_and_calls() -> None:
    line = event_line(model_event(2, read=1500))
    assert (
        line
        == "step  2  model   2,000 in (1,500 cached)    50 out  $0.0123  → read_frame(shot=3)"
    )


def test_model_line_shows_a_provider_switch() -> None:
    event = model_event(2, read=0).model_copy(
        update={
            "provider": "fal",
            "fallback_from": [{"provider": "anthropic", "reason": "HTTP 529"}],
        }
    )
    assert event_line(event).endswith(
        "→ read_frame(shot=3)  [via fal: anthropic HTTP 529]"
    )
    # as a run's stream holds it
    assert event_line(event.model_dump(mode="json")) == event_line(event)
    assert "via" not in event_line(
        model_event(2, read=0).model_copy(update={"provider": "anthropic"})
    )


def test_step_override_numbers_steps_across_segments() -> None:
    assert event_line(model_event(1, read=0), step=5).startswith("step  5  model")


def test_tool_and_run_event_lines() -> None:
    tool = ToolEvent(
        step=3,
        name="render_preview",
        call_id="c",
        cost_usd=0.0055,
        summary="Preview rendered.",
    )
    assert (
        event_line(tool)
        == "step  3  tool   render_preview   $0.0055  Preview rendered."
    )
    parked = {
        "id": "1-0",
        "seq": 7,
        "segment": 0,
        "kind": "parked",
        "asked": {"question": "Keep shot 3?"},
    }
    assert (
        event_line(parked)
        == "run      parked: no worker holds it while it waits for the answer"
    )
    failed = {
        "kind": "failed",
        "error_class": "ToolArgumentsError",
        "error_message": "Tool call ...",
    }
    assert event_line(failed) == "run      failed: ToolArgumentsError Tool call ..."
    other = {"id": "2-0", "seq": 8, "segment": 1, "kind": "resumed", "note": "x"}
    assert event_line(other) == 'run      resumed  {"note": "x"}'


def test_approval_event_lines() -> None:
    requested = {
        "kind": "approval_requested",
        "call_id": "c7",
        "name": "publish",
        "input": {"shot": 3},
    }
    assert (
        event_line(requested)
        == 'run      approval requested: publish {"shot": 3} (call c7)'
    )
    decided = {
        "kind": "approval_decided",
        "call_id": "c7",
        "action": "reject",
        "reason": "no",
        "actor": "ana",
    }
    assert (
        event_line(decided) == "run      approval decided: reject: no by ana (call c7)"
    )
    expired = {"kind": "approval_expired", "call_id": "c7", "outcome": "reject"}
    assert (
        event_line(expired) == "run      approval expired: reject by default (call c7)"
    )


def test_cache_savings_are_reads_at_their_discount_minus_the_write_premium() -> None:
    totals = Totals()
    totals.add_model(model_event(1, read=0, write=1000))
    totals.add_model(model_event(2, read=1000))
    assert (totals.steps, totals.cache_read, totals.cache_write) == (2, 1000, 1000)
    # claude-sonnet-4-6: $3/MTok input, reads $0.30, writes $3.75 (the catalogue)
    saved = totals.cache_savings_usd("claude-sonnet-4-6")
    assert saved is not None
    assert abs(saved - (1000 * 2.7 - 1000 * 0.75) / 1e6) < 1e-12
    assert totals.cache_savings_usd("no-such-model") is None
    # via fal: reads at 0.25x, writes at 1x
    gemini = totals.cache_savings_usd("google/gemini-3.8-flash")
    assert gemini is not None and abs(gemini - 1000 * 0.75 * 0.75 / 1e6) < 1e-12


def test_progress_line_only_on_a_terminal() -> None:
    pipe = io.StringIO()
    progress = Progress(pipe)
    progress.set("step 1")
    progress.line("event")
    progress.clear()
    assert pipe.getvalue() == "event\n"

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    progress = Progress(tty)
    progress.set("step 1")
    progress.line("event")
    progress.set("step 2")
    assert tty.getvalue() == "\r\x1b[Kstep 1\r\x1b[Kevent\n\r\x1b[Kstep 2"


def test_status_block(capsys: pytest.CaptureFixture[str]) -> None:
    from toolloop.cli.follow import print_status
    from workers.protocol.records import RunStatus

    class Stub:
        def status(self, run_id: str) -> RunStatus:
            return RunStatus(
                run_id=run_id,
                status="asked",
                steps=4,
                spent_usd=0.0262,
                asked={"question": "Keep shot 3?"},
                created_at=0.0,
            )

    print_status(Stub(), "r1")
    assert capsys.readouterr().out.splitlines() == [
        "run_id      r1",
        "status      asked",
        "segment     0",
        "steps       4",
        "spent_usd   $0.0262",
        'asked       {"question": "Keep shot 3?"}',
        "created_at  1970-01-01 00:00:00 UTC",
    ]


def test_refused_paused_and_cut_lines() -> None:
    refusal = {"category": "cyber", "explanation": "Exploit development."}
    refused = model_event(4, read=0).model_copy(
        update={"tool_calls": [], "finish_reason": "refusal", "refusal": refusal}
    )
    assert event_line(refused).endswith(
        "$0.0123  refused (category cyber: Exploit development.)"
    )
    paused = model_event(1, read=0).model_copy(update={"finish_reason": "paused"})
    assert event_line(paused).endswith("[paused: sent back] → read_frame(shot=3)")
    cut = model_event(1, read=0).model_copy(update={"finish_reason": "length"})
    assert event_line(cut).endswith("[cut at max_tokens] → read_frame(shot=3)")
    finished = {
        "kind": "finished",
        "stopped_by": "refused",
        "refusal": {"category": None},
    }
    assert event_line(finished) == "run      finished: refused (no category)"


def test_a_park_for_decisions_and_an_account_stop_say_what_they_are() -> None:
    held = [{"call_id": "c1"}, {"call_id": "c2"}]
    parked = {"kind": "parked", "approvals": held}
    assert (
        event_line(parked)
        == "run      parked: no worker holds it while it waits for a decision on 2 calls"
    )
    account = {
        "name": "studio-a",
        "period": "day",
        "period_id": "2026-12-02",
        "limit_usd": 1.0,
        "spent_usd": 0.995,
    }
    stop = {
        "kind": "budget",
        "spent_usd": 0.2,
        "limit_usd": 5.0,
        "mode": "stop",
        "account": account,
    }
    assert event_line(stop) == (
        "budget   budget stop: account studio-a reached its limit of $1.00 per day (2026-12-02: $0.9950 "
        "spent) (the run spent $0.2000 of its $5.00)"
    )
    finished = {
        "kind": "finished",
        "stopped_by": "budget",
        "account": {**account, "period": "total"},
    }
    assert event_line(finished) == (
        "run      finished: budget (account studio-a reached its limit of $1.00 in total ($0.9950 spent))"
    )
    own = {"kind": "budget", "spent_usd": 1.0, "limit_usd": 1.0, "mode": "stop"}
    # the run's own budget, as before
    assert event_line(own) == "budget   budget stop at $1.0000 of $1.00"
