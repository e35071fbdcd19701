"""Prompt-cache accounting after Anthropic's published rules (PROVIDERS.md), shared by both wires.

A request is a list of blocks in prefix order: tool definitions, then system blocks, then message
blocks. A block with `cache_control` is a breakpoint (at most 4; a 1-hour one may not follow a
5-minute one). Entries are keyed by a hash of the model and the whole prefix up to a block, so any
change to an earlier block (or another model) misses everything after it.

For each breakpoint the lookup checks that position and the `lookback` (20) positions before it for
a live entry; the furthest hit is the cache read, and refreshes that entry's TTL. Every breakpoint
after the read point whose prefix reaches the model's minimum cacheable length (the catalogue's
`min_cache_tokens`, else 1,024 tokens) is written. Usage is reported as the API does:
`cache_read_input_tokens` = the read prefix,
`cache_creation_input_tokens` = from the read point to the last written breakpoint,
`input_tokens` = the rest. The cache is per server (the real one is per organisation), and reads
happen when a request arrives while writes land when its answer is sent (`plan` then `commit`), so
concurrent requests with a new prefix all pay for the write, as they do on the real API.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from toolloop.providers.catalog import Catalog

Ttl = Literal["5m", "1h"]
TTL_SECONDS: dict[str, float] = {"5m": 300.0, "1h": 3600.0}
MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
MIN_CACHE_TOKENS = 1024


class CacheRequestError(ValueError):
    """The request's cache marks break a rule the API enforces (answered 400 invalid_request_error)."""


@dataclass(frozen=True)
class Block:
    """One block of the prompt: `key` is its canonical text (context such as the role included),
    `tokens` its estimate, `mark` the TTL of its `cache_control` breakpoint, if any."""

    key: str
    tokens: int
    mark: Ttl | None = None


@dataclass(frozen=True)
class CacheUsage:
    input_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    ephemeral_5m_input_tokens: int = 0
    ephemeral_1h_input_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        """Every prompt token: input + cache read + cache write."""
        return (
            self.input_tokens
            + self.cache_read_input_tokens
            + self.cache_creation_input_tokens
        )


@dataclass(frozen=True)
class CachePlan:
    usage: CacheUsage
    writes: list[tuple[bytes, Ttl]] = field(default_factory=list)


@dataclass
class _Entry:
    ttl: Ttl
    expires_at: float


class PromptCache:
    """The server's prompt cache. `clock` (seconds, monotonic) is injectable for TTL tests."""

    def __init__(
        self,
        *,
        min_tokens: int = MIN_CACHE_TOKENS,
        model_min_tokens: Mapping[str, int] | None = None,
        lookback: int = LOOKBACK_BLOCKS,
        clock: Callable[[], float] = time.monotonic,
        catalog: Catalog | None = None,
    ) -> None:
        self.min_tokens = min_tokens
        self.model_min_tokens = dict(model_min_tokens or {})
        self.catalog = catalog
        self.lookback = lookback
        self.clock = clock
        self._entries: dict[bytes, _Entry] = {}
        self._lock = threading.Lock()
        self._swept_at = clock()

    def min_tokens_for(self, model: str) -> int:
        """The minimum cacheable prefix of a model: the first `model_min_tokens` key contained in the
        model id, else the catalogue's `min_cache_tokens` for it, else `min_tokens`."""
        for key, value in self.model_min_tokens.items():
            if key in model:
                return value
        info = self.catalog.find(model) if self.catalog is not None else None
        if info is not None and info.min_cache_tokens is not None:
            return info.min_cache_tokens
        return self.min_tokens

    def account(self, model: str, blocks: Sequence[Block]) -> CacheUsage:
        """Plan and commit at once (a request whose answer is sent right away)."""
        plan = self.plan(model, blocks)
        self.commit(plan)
        return plan.usage

    def plan(self, model: str, blocks: Sequence[Block]) -> CachePlan:
        """Read the cache for a request: the usage it will report and the entries it will write."""
        marks = [index for index, block in enumerate(blocks) if block.mark]
        _check_marks([blocks[index].mark for index in marks])
        digests = _prefix_digests(model, blocks)
        totals: list[int] = []
        running = 0
        for block in blocks:
            running += block.tokens
            totals.append(running)
        with self._lock:
            now = self.clock()
            self._sweep(now)
            read_at = self._lookup(marks, digests, now)
        read = totals[read_at] if read_at >= 0 else 0
        writes: list[tuple[bytes, Ttl]] = []
        written_to, by_ttl = read_at, {"5m": 0, "1h": 0}
        for index in marks:
            mark = blocks[index].mark
            if (
                index <= read_at
                or mark is None
                or totals[index] < self.min_tokens_for(model)
            ):
                continue
            writes.append((digests[index], mark))
            by_ttl[mark] += totals[index] - (
                totals[written_to] if written_to >= 0 else 0
            )
            written_to = index
        cached = totals[written_to] if written_to >= 0 else 0
        usage = CacheUsage(
            input_tokens=running - cached,
            cache_read_input_tokens=read,
            cache_creation_input_tokens=cached - read,
            ephemeral_5m_input_tokens=by_ttl["5m"],
            ephemeral_1h_input_tokens=by_ttl["1h"],
        )
        return CachePlan(usage, writes)

    def commit(self, plan: CachePlan) -> None:
        """Store the entries a planned request writes (TTL counted from now)."""
        with self._lock:
            now = self.clock()
            for digest, ttl in plan.writes:
                self._entries[digest] = _Entry(ttl, now + TTL_SECONDS[ttl])

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            now = self.clock()
            return sum(1 for entry in self._entries.values() if entry.expires_at > now)

    def _lookup(self, marks: list[int], digests: list[bytes], now: float) -> int:
        read_at = -1
        for mark in marks:
            for index in range(mark, max(-1, mark - self.lookback - 1), -1):
                if index <= read_at:
                    break
                entry = self._entries.get(digests[index])
                if entry is not None and entry.expires_at > now:
                    read_at = index
                    break
        if read_at >= 0:
            entry = self._entries[digests[read_at]]
            entry.expires_at = now + TTL_SECONDS[entry.ttl]
        return read_at

    def _sweep(self, now: float) -> None:
        if now - self._swept_at < 30.0:
            return
        self._swept_at = now
        for digest in [
            key for key, entry in self._entries.items() if entry.expires_at <= now
        ]:
            del self._entries[digest]


def _check_marks(marks: list[Ttl | None]) -> None:
    if len(marks) > MAX_BREAKPOINTS:
        raise CacheRequestError(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(marks)}."
        )
    if (
        "1h" in marks
        and "5m" in marks
        and marks.index("5m") < len(marks) - 1 - marks[::-1].index("1h")
    ):
        raise CacheRequestError(
            "A cache_control block with ttl '1h' may not come after one with ttl '5m'. "
            "Put the 1h breakpoints first."
        )


def _prefix_digests(model: str, blocks: Sequence[Block]) -> list[bytes]:
    running = hashlib.sha256(model.encode())
    digests: list[bytes] = []
    for block in blocks:
        running.update(block.key.encode())
        running.update(b"\x00")
        digests.append(running.copy().digest())
    return digests
