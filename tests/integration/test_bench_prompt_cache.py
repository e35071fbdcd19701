"""bench/prompt_cache.py runs at a small size against the simulator and meets its target: the
cached share of the prompt from turn 3 on is at least 90 %, and caching the conversation costs less
than caching the system prompt, which costs less than no cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.prompt_cache import main

pytestmark = pytest.mark.integration


async def test_the_prompt_cache_benchmark_runs_and_meets_its_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cache.json"
    assert await main(["--turns", "8", "--json", str(out)]) == 0
    rows = {row["mode"]: row for row in json.loads(out.read_text())["modes"]}
    assert (
        rows["off"]["cache_read_tokens"] == 0 and rows["off"]["cache_write_tokens"] == 0
    )
    assert rows["conversation"]["cached_share_from_turn_3"] >= 0.9
    assert (
        rows["conversation"]["cost_usd"]
        < rows["system"]["cost_usd"]
        < rows["off"]["cost_usd"]
    )
    assert "target >= 90%: met" in capsys.readouterr().out
