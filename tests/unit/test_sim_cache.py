"""Prompt-cache accounting of the simulator, from Anthropic's documented caching rules."""

from __future__ import annotations

import pytest

from toolloop.sim.cache import Block, CacheRequestError, CacheUsage, PromptCache

MODEL = "claude-sonnet-test"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def blocks(*specs: tuple[str, int] | tuple[str, int, str]) -> list[Block]:
    out = []
    for spec in specs:
        mark = spec[2] if len(spec) == 3 else None
        out.append(Block(spec[0], spec[1], mark))  # type: ignore[arg-type]
    return out


def conversation(
    turns: int, mark_last: bool = True, prev_mark: int | None = None
) -> list[Block]:
    """tools (600) + system (600, marked) + `turns` small blocks; the last one marked."""
    out = blocks(("tool", 600), ("system", 600, "5m"))
    for index in range(turns):
        marked = (mark_last and index == turns - 1) or (
            prev_mark is not None and index == prev_mark
        )
        out.append(Block(f"m{index}", 10, "5m" if marked else None))
    return out


def test_first_request_writes_and_identical_prefix_reads() -> None:
    cache = PromptCache()
    request = blocks(("tools", 500), ("system", 1500, "5m"), ("user: hi", 7))
    first = cache.account(MODEL, request)
    assert first == CacheUsage(
        input_tokens=7, cache_creation_input_tokens=2000, ephemeral_5m_input_tokens=2000
    )
    second = cache.account(MODEL, request)
    assert second == CacheUsage(input_tokens=7, cache_read_input_tokens=2000)
    assert second.prompt_tokens == first.prompt_tokens == 2007


def test_a_changed_early_block_misses_everything_after_it() -> None:
    cache = PromptCache()
    cache.account(MODEL, blocks(("tools v1", 500), ("system", 1500, "5m"), ("user", 7)))
    changed = cache.account(
        MODEL, blocks(("tools v2", 500), ("system", 1500, "5m"), ("user", 7))
    )
    assert changed.cache_read_input_tokens == 0
    assert changed.cache_creation_input_tokens == 2000


def test_another_model_does_not_share_entries() -> None:
    cache = PromptCache()
    request = blocks(("system", 2000, "5m"), ("user", 7))
    cache.account(MODEL, request)
    assert cache.account("claude-other", request).cache_read_input_tokens == 0


def test_a_growing_conversation_reads_the_previous_mark_and_writes_the_new_one() -> (
    None
):
    cache = PromptCache()
    cache.account(MODEL, conversation(3))  # writes system (1200) and up to m2 (1230)
    # m5 marked: lookback finds m2's entry
    usage = cache.account(MODEL, conversation(6))
    assert usage.cache_read_input_tokens == 1230
    assert usage.cache_creation_input_tokens == 30
    assert usage.input_tokens == 0


def test_the_lookback_window_is_twenty_blocks() -> None:
    cache = PromptCache()
    cache.account(MODEL, conversation(3))  # entry at m2 = block index 4
    # new mark at index 24: 20 blocks back is 4
    within = cache.plan(MODEL, conversation(3 + 20))
    assert within.usage.cache_read_input_tokens == 1230
    # mark at 25: the window stops at 5
    beyond = cache.plan(MODEL, conversation(3 + 21))
    # only the system entry, by its own mark
    assert beyond.usage.cache_read_input_tokens == 1200
    assert beyond.usage.cache_creation_input_tokens == 21 * 10 + 30


def test_a_second_mark_where_the_previous_request_put_its_own_bridges_a_long_turn() -> (
    None
):
    cache = PromptCache()
    cache.account(MODEL, conversation(3))
    usage = cache.account(MODEL, conversation(30, prev_mark=2))
    assert usage.cache_read_input_tokens == 1230
    assert usage.cache_creation_input_tokens == 27 * 10


def test_a_prefix_below_the_minimum_is_not_cached_and_no_error_is_raised() -> None:
    cache = PromptCache()
    short = blocks(("system", 1000, "5m"), ("user", 20))
    assert cache.account(MODEL, short) == CacheUsage(input_tokens=1020)
    assert cache.account(MODEL, short) == CacheUsage(input_tokens=1020)
    assert len(cache) == 0


def test_the_minimum_depends_on_the_model() -> None:
    cache = PromptCache(model_min_tokens={"haiku": 2048})
    request = blocks(("system", 1500, "5m"), ("user", 20))
    assert cache.account("claude-haiku-x", request).cache_creation_input_tokens == 0
    assert cache.account("claude-sonnet-x", request).cache_creation_input_tokens == 1500


def test_five_minute_ttl_expires_and_is_refreshed_by_each_hit() -> None:
    clock = Clock()
    cache = PromptCache(clock=clock)
    request = blocks(("system", 2000, "5m"), ("user", 7))
    cache.account(MODEL, request)
    clock.now += 299
    # refreshed here
    assert cache.account(MODEL, request).cache_read_input_tokens == 2000
    clock.now += 299
    assert cache.account(MODEL, request).cache_read_input_tokens == 2000
    clock.now += 301
    expired = cache.account(MODEL, request)
    assert expired.cache_read_input_tokens == 0
    assert expired.cache_creation_input_tokens == 2000


def test_one_hour_ttl_outlives_five_minutes_and_is_reported_apart() -> None:
    clock = Clock()
    cache = PromptCache(clock=clock)
    request = blocks(("tools", 1200, "1h"), ("system", 800, "5m"), ("user", 7))
    first = cache.account(MODEL, request)
    assert (first.ephemeral_1h_input_tokens, first.ephemeral_5m_input_tokens) == (
        1200,
        800,
    )
    clock.now += 600
    later = cache.account(MODEL, request)
    assert later.cache_read_input_tokens == 1200
    assert later.cache_creation_input_tokens == 800


def test_more_than_four_breakpoints_is_an_invalid_request() -> None:
    cache = PromptCache()
    request = [Block(f"b{index}", 300, "5m") for index in range(5)]
    with pytest.raises(
        CacheRequestError, match="A maximum of 4 blocks with cache_control"
    ):
        cache.plan(MODEL, request)
    assert cache.account(MODEL, request[:4]).cache_creation_input_tokens == 1200


def test_a_one_hour_mark_after_a_five_minute_mark_is_an_invalid_request() -> None:
    with pytest.raises(CacheRequestError, match="1h"):
        PromptCache().plan(MODEL, blocks(("a", 2000, "5m"), ("b", 10, "1h")))


def test_concurrent_requests_for_a_new_prefix_all_write() -> None:
    cache = PromptCache()
    request = blocks(("system", 2000, "5m"), ("user", 7))
    plans = [cache.plan(MODEL, request) for _ in range(3)]
    for plan in plans:
        cache.commit(plan)
    assert [plan.usage.cache_creation_input_tokens for plan in plans] == [
        2000,
        2000,
        2000,
    ]
    assert cache.account(MODEL, request).cache_read_input_tokens == 2000


def test_the_servers_cache_settings_reach_its_simulator() -> None:
    # an empty PromptCache is falsy (it has a length): the simulator once replaced it with a
    # default one, and SimServer's min_cache_tokens (and --min-cache-tokens) did nothing
    from toolloop.sim import SimServer

    server = SimServer([], min_cache_tokens=4321, model_min_cache_tokens={"x": 7})
    cache = server.simulator.cache
    assert (cache.min_tokens, cache.model_min_tokens) == (4321, {"x": 7})
