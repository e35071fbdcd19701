"""A streaming run's text on the terminal as it arrives: `delta` entries are written on one line per
model step (thinking text on its own `thinking` line), and a `discarded` marker says the text shown
for that attempt is void (the step is answered again; the new text follows on a new line)."""

from __future__ import annotations

from typing import Any, TextIO

from toolloop.cli.render import field

STREAM_KINDS = frozenset({"delta", "discarded"})


class TextView:
    """The text of the step streaming now. `open`: a line of text is not ended yet."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.open = False
        self.current: tuple[Any, ...] | None = None
        self.shown: set[tuple[Any, ...]] = set()
        """The (segment, step, attempt) whose text was written."""

    def add(self, event: Any, step: int) -> None:
        """`step`: the run-wide number of the event's step (render.StepNumbers, as the event lines)."""
        key = (field(event, "segment"), field(event, "step"), field(event, "attempt"))
        if field(event, "kind") == "discarded":
            if key in self.shown:
                self.end()
                self.out.write(
                    f"step {step:>2}  text   (discarded: the step's answer is made again)\n"
                )
                self.out.flush()
            return
        thinking = bool(field(event, "thinking"))
        if (*key, thinking) != self.current:
            self.end()
            self.out.write(f"step {step:>2}  {'think' if thinking else 'text '}  ")
            self.current = (*key, thinking)
            self.shown.add(key)
        self.out.write(str(field(event, "text") or "").replace("\n", "\n           "))
        self.out.flush()
        self.open = True

    def end(self) -> None:
        """End the text line, if one is open (before any other line)."""
        if self.open:
            self.out.write("\n")
            self.out.flush()
        self.open = False
        self.current = None
