"""The simulated model of the storyboard review: a policy for `toolloop.sim` that plays a realistic
review over the toolset in tools.py, reading what the tools answered.

    list_shots → read_frame of each shot that runs long (one turn, several calls) → render_preview
    of the proposed cut → ask the director about the matter of taste → the final notes, which quote
    the director's answer.

It answers from the request alone (the history), so a replayed or retried request gets the same
turn, as the simulator requires.
"""

from __future__ import annotations

import re
from typing import Any

from toolloop import AssistantMessage, ToolMessage, UserMessage
from toolloop.sim.script import SimRequest, SimToolCall, SimTurn

SHOT_LINE = re.compile(
    r"^(\d+)\. (.+): ([\d.]+) s \(board says ([\d.]+) s\)$", re.MULTILINE
)


def text_of(message: ToolMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "\n".join(part.text for part in message.content if part.type == "text")


def results_by_tool(request: SimRequest) -> dict[str, list[str]]:
    """Tool name → the texts of its results so far, in order."""
    names: dict[str, str] = {}
    results: dict[str, list[str]] = {}
    for message in request.messages:
        if isinstance(message, AssistantMessage):
            names.update({call.id: call.name for call in message.tool_calls or []})
        elif isinstance(message, ToolMessage):
            results.setdefault(names.get(message.tool_call_id, "?"), []).append(
                text_of(message)
            )
    return results


def shots(listing: str) -> list[dict[str, Any]]:
    return [
        {"n": int(n), "title": title, "cut": float(cut), "board": float(board)}
        for n, title, cut, board in SHOT_LINE.findall(listing)
    ]


def call(name: str, **input: Any) -> SimToolCall:
    return SimToolCall(name=name, input=input)


def review_policy(request: SimRequest) -> SimTurn:
    done = results_by_tool(request)
    if "list_shots" in request.tool_names and "list_shots" not in done:
        return SimTurn(
            text="Let me compare the cut with the board first.",
            tool_calls=[call("list_shots")],
        )
    board = shots(done.get("list_shots", [""])[0])
    long = [shot for shot in board if shot["cut"] > shot["board"]]
    if long and "read_frame" not in done:
        names = ", ".join(
            f"shot {shot['n']} (+{shot['cut'] - shot['board']:.1f} s)" for shot in long
        )
        return SimTurn(
            text=f"Two shots run over the board: {names}. I'll look at their key frames.",
            tool_calls=[call("read_frame", shot=shot["n"]) for shot in long],
        )
    if long and "render_preview" not in done:
        return SimTurn(
            text="Shot 3 is the warm sunset entrance; shot 5 is the cool rooftop reveal, with dead air "
            "after the phone lights up. Rendering the sequence around both so you can watch it.",
            tool_calls=[call("render_preview", shots=[shot["n"] for shot in long])],
        )
    if "ask" in request.tool_names and "ask" not in done:
        hero = next((shot for shot in board if shot["n"] == 3), None)
        kept, target = (
            (hero["board"] + KEEP_EXTRA_S, hero["board"]) if hero else (5.0, 4.0)
        )
        return SimTurn(
            text="Shot 5's trim is clear. Shot 3 is a matter of taste.",
            tool_calls=[
                call(
                    "ask",
                    question="Shot 3 is the hero's entrance: keep one extra second to let it breathe "
                    f"({kept:.1f} s), or trim it to the board's {target:.1f} s?",
                )
            ],
        )
    return SimTurn(
        text=final_notes(board, long, (done.get("ask") or ["(no answer)"])[0])
    )


KEEP_EXTRA_S = 1.0
"""What "keep shot N" means in the question the review asks: one second over the board."""
TRIM_BY = re.compile(r"trim shot (\d+) by (a|one|[\d.]+) seconds?", re.IGNORECASE)
KEEP = re.compile(r"keep shot (\d+)", re.IGNORECASE)


def final_notes(
    board: list[dict[str, Any]], long: list[dict[str, Any]], answer: str
) -> str:
    """The notes: every long shot trimmed to the board, unless the director kept it or named a trim."""
    kept = {int(n) for n in KEEP.findall(answer)}
    trims = {
        int(n): 1.0 if by.lower() in ("a", "one") else float(by)
        for n, by in TRIM_BY.findall(answer)
    }
    notes = []
    after = sum(shot["cut"] for shot in board)
    for shot in long:
        n, cut = shot["n"], shot["cut"]
        if (
            n in kept
        ):  # the question's "keep": one second over the board, not the whole rough cut
            new = min(cut, shot["board"] + KEEP_EXTRA_S)
            after -= cut - new
            notes.append(
                f"trim shot {n} ({shot['title']}) from {cut:.1f} s to {new:.1f} s, keeping "
                f"one second over the board's {shot['board']:.1f} s as you asked"
            )
            continue
        new = cut - trims[n] if n in trims else shot["board"]
        after -= cut - new
        notes.append(f"trim shot {n} ({shot['title']}) from {cut:.1f} s to {new:.1f} s")
    before = sum(shot["cut"] for shot in board)
    target = sum(shot["board"] for shot in board)
    looked = " and ".join(str(shot["n"]) for shot in long)
    return (
        f'You said: "{answer}" So: {"; ".join(notes)}. I looked at the key frames of shots {looked} and '
        f"rendered a preview of them; the other shots match the board and stay. Running time "
        f"{before:.1f} s before, {after:.1f} s after, against the board's {target:.1f} s."
    )


SEND_TO = re.compile(r"\b(dailies|director|studio|editor)\b", re.IGNORECASE)


def publish_policy(request: SimRequest) -> SimTurn:
    """The simulated model of the README's approvals: it sends the cut to each recipient the user's
    first message names (`send_cut`, which needs approval: the calls of one turn are held together),
    then reports what each send came to as the tools answered (sent, edited, or rejected)."""
    done = results_by_tool(request)
    if "send_cut" in request.tool_names and "send_cut" not in done:
        first = next((m for m in request.messages if isinstance(m, UserMessage)), None)
        content = first.content if first is not None else ""
        text = (
            content
            if isinstance(content, str)
            else " ".join(getattr(p, "text", "") for p in content)
        )
        named = list(
            dict.fromkeys(match.lower() for match in SEND_TO.findall(text))
        ) or ["dailies"]
        return SimTurn(
            text=f"Sending the trimmed cut to {', '.join(named)}; each send waits for your approval.",
            tool_calls=[
                call("send_cut", to=to, note="Rooftop sequence, trimmed.")
                for to in named
            ],
        )
    outcomes = done.get("send_cut", [])
    return SimTurn(text="What came of each send: " + " | ".join(outcomes))
