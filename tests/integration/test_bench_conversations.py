"""bench/conversations.py runs at a small size and meets its targets: a chat session's follow-ups read
>= 90 % of their prompt tokens from the cache from the third message on, with the whole conversation
in `history`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.conversations import main

pytestmark = pytest.mark.integration


def test_the_chat_session_benchmark_runs_and_meets_its_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "chat.json"
    assert main(["chat", "--messages", "5", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["chat"]
    assert (
        row["cached_share_from_3"] >= 0.9
        and row["history_whole"]
        and row["messages"] == 6
    )
    assert "(target >= 90%: met)" in capsys.readouterr().out
