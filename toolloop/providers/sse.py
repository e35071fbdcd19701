"""Server-Sent Events, read incrementally: bytes in, `(event, data)` pairs out (the WHATWG
event-stream rules a model stream needs: `event:` and `data:` fields, multi-line data joined with
newlines, comment lines starting with `:` ignored, CRLF, CR or LF line ends, a blank line ends an
event). `id:` and `retry:` are read and dropped: a model stream is never resumed by id."""

from __future__ import annotations

import codecs


class SseParser:
    """`feed(chunk)` returns the events the chunk completed, in order, as `(event, data)`; the event
    name is `"message"` when the stream gave none (as OpenAI-compatible streams do)."""

    __slots__ = ("_data", "_decoder", "_event", "_pending_cr", "_tail")

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._tail = ""
        self._pending_cr = False
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        text = self._decoder.decode(chunk)
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]  # the LF of a CRLF split across two chunks
        self._pending_cr = text.endswith("\r")
        lines = (self._tail + text).splitlines(keepends=True)
        self._tail = ""
        if lines and not lines[-1].endswith(("\n", "\r")):
            self._tail = lines.pop()
        events: list[tuple[str, str]] = []
        for raw in lines:
            line = raw.rstrip("\r\n")
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
