"""Server-Sent Events, read incrementally: bytes in, `(event, data)` pairs out (the WHATWG
event-stream rules a model stream needs: `event:` and `data:` fields, multi-line data joined with
newlines, comment lines starting with `:` ignored, CRLF, CR or LF line ends, a blank line ends an
event). `id:` and `retry:` are read and dropped: a model stream is never resumed by id.

Hot path: a stream with LF line ends (what Anthropic, OpenRouter and the simulator send) is cut into
events on `b"\\n\\n"` in bytes, a whole socket read at once; an event of one `event:` line and one
`data:` line, or one `data:` line, is read without a line split. The first CR seen turns the parser
to the line-by-line path for the rest of the stream (any chunking gives the same events)."""

from __future__ import annotations

import codecs

from toolloop.contract import DeltaEvent, OnDelta

_EVENT = b"event: "
_DATA = b"data: "
_EVENT_DATA = b"\ndata: "


class SseParser:
    """`feed(chunk)` returns the events the chunk completed, in order, as `(event, data)`; the event
    name is `"message"` when the stream gave none (as OpenAI-compatible streams do)."""

    __slots__ = (
        "_buffer",
        "_data",
        "_decoder",
        "_event",
        "_lines",
        "_pending_cr",
        "_tail",
    )

    def __init__(self) -> None:
        self._buffer = b""
        """LF path: the bytes after the last complete event."""
        self._lines = False
        """True once a CR was seen: the line-by-line path from then on."""
        self._decoder: codecs.IncrementalDecoder | None = None
        self._tail = ""
        self._pending_cr = False
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        raw = self.complete(chunk)
        if raw is not None:
            return self.events(raw)
        if not self._lines:
            self._lines = True
            pending, self._buffer = self._buffer, b""
            chunk = pending + chunk
        return self._feed_lines(chunk)

    def complete(self, chunk: bytes) -> bytes | None:
        """LF path: the complete events the chunk ends, as their bytes (through the last blank
        line; the rest is kept for the next chunk), to read with `events`. None (nothing taken)
        once the stream has shown a CR: `feed` the chunk then."""
        if self._lines or b"\r" in chunk:
            return None
        raw = self._buffer + chunk if self._buffer else chunk
        end = raw.rfind(b"\n\n") + 2
        if end < 2:
            self._buffer = raw
            return b""
        self._buffer = raw[end:]
        return raw[:end]

    def events(self, raw: bytes) -> list[tuple[str, str]]:
        """The events of `raw`: complete LF-ended events (what `complete` gives)."""
        blocks = raw.split(b"\n\n")
        blocks.pop()  # what follows the last blank line: nothing
        events: list[tuple[str, str]] = []
        for block in blocks:
            if block.startswith(_EVENT):
                name, found, data = block.partition(_EVENT_DATA)
                if found and b"\n" not in data and b"\n" not in name:
                    events.append(
                        (
                            name[7:].decode("utf-8", "replace"),
                            data.decode("utf-8", "replace"),
                        )
                    )
                    continue
            elif block.startswith(_DATA) and b"\n" not in block:
                events.append(("message", block[6:].decode("utf-8", "replace")))
                continue
            if block:
                events.extend(self._feed_lines(block + b"\n\n"))
        return events

    def _feed_lines(self, chunk: bytes) -> list[tuple[str, str]]:
        if self._decoder is None:
            self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = self._decoder.decode(chunk)
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]  # the LF of a CRLF split across two chunks
        self._pending_cr = text.endswith("\r")
        *lines, self._tail = (
            (self._tail + text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
        )
        events: list[tuple[str, str]] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append((self._event or "message", "\n".join(self._data)))
                self._event, self._data = "", []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                self._event = value
            elif name == "data":
                self._data.append(value)
        return events


class DeltaOut:
    """The delta text a stream reader (anthropic's `MessageStream`, fal's `CompletionStream`) read
    since its last `flush`, all of one kind, passed on as one `DeltaEvent` per socket read (SPEC
    4.3: a delta carries any amount of text), not one per event."""

    __slots__ = ("on_delta", "out", "out_thinking")

    def __init__(self, on_delta: OnDelta | None) -> None:
        self.on_delta = on_delta
        self.out: list[str] = []
        """The delta text read since the last `flush`, all of one kind..."""
        self.out_thinking = False
        """...reasoning (True) or answer text."""

    def emit(self, text: str, *, thinking: bool) -> None:
        """Keep `text` for the next `flush` (a change of kind flushes what was kept first)."""
        if self.on_delta is not None and text:
            if self.out and self.out_thinking is not thinking:
                self.flush()
            self.out_thinking = thinking
            self.out.append(text)

    def flush(self) -> bool:
        """Pass the text kept since the last flush on as one `DeltaEvent`; True when there was some."""
        if self.out and self.on_delta is not None:
            text = self.out[0] if len(self.out) == 1 else "".join(self.out)
            self.out.clear()
            self.on_delta(DeltaEvent(text=text, thinking=self.out_thinking))
            return True
        return False
