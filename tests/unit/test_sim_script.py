"""Scripts, turns, faults and the token estimate of the simulator (no server)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pydantic
import pytest

from toolloop.sim import (
    AFTER_SCRIPT,
    Script,
    SimFault,
    SimRequest,
    SimTurn,
    as_policy,
    load_script,
)
from toolloop.sim.__main__ import main
from toolloop.sim.tokens import IMAGE_TOKENS, json_tokens, text_tokens

YAML_SCRIPT = """\
- text: Let me look.
  tool_calls:
    - {name: read_frame, input: {shot: 3}}
- fault: {status: 429, retry_after: 1, times: 2}
  text: Shot 3 is fine.
"""


def request(assistant_turns: int) -> SimRequest:
    return SimRequest("anthropic", "m", None, [], [], assistant_turns, "c", "h")


def test_a_yaml_script_answers_by_the_number_of_assistant_turns(tmp_path: Path) -> None:
    path = tmp_path / "turns.yaml"
    path.write_text(YAML_SCRIPT)
    script = load_script(path)
    first, second, after = script(request(0)), script(request(1)), script(request(2))
    assert first.tool_calls[0].name == "read_frame" and first.tool_calls[0].input == {
        "shot": 3
    }
    assert second.fault == SimFault(status=429, retry_after=1, times=2)
    assert after == AFTER_SCRIPT and after.tool_calls == []


def test_a_json_script_may_wrap_its_turns(tmp_path: Path) -> None:
    path = tmp_path / "turns.json"
    path.write_text(json.dumps({"turns": [{"text": "Hi"}, "Bye"]}))
    script = as_policy(str(path))
    assert isinstance(script, Script) and len(script) == 2
    assert script(request(1)) == SimTurn(text="Bye")


def test_a_script_that_is_not_a_list_says_what_to_write(tmp_path: Path) -> None:
    path = tmp_path / "turns.yaml"
    path.write_text("text: Hi\n")
    with pytest.raises(ValueError, match="is not a list of turns"):
        load_script(path)


@pytest.mark.parametrize(
    "fault",
    [
        {"status": 200},
        {"kind": "error"},
        {"status": 500, "times": 0},
        {"kind": "explode"},
        {"status": 500, "x": 1},
    ],
)
def test_bad_faults_are_refused(fault: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        SimTurn.model_validate({"fault": fault})


def test_the_token_estimate() -> None:
    assert text_tokens("") == 0
    assert text_tokens("abcd") == 1 and text_tokens("abcde") == 2
    # 4 ASCII characters, plus one per non-ASCII code point
    assert text_tokens("héllo") == 1 + 1
    assert json_tokens({"a": 1}) == text_tokens('{"a":1}')
    assert IMAGE_TOKENS == 1000


def test_the_command_refuses_a_missing_script_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--port", "0", "--script", str(tmp_path / "missing.yaml")]) == 2
    assert "Cannot read the script" in capsys.readouterr().err


def test_the_command_says_when_its_port_is_taken(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["--port", str(taken.getsockname()[1])]) == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
