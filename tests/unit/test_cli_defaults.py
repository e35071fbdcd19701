"""The embedded defaults' decisions that need no server, and the command's two-line error messages."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from toolloop import defaults
from toolloop.cli.errors import DEBUG_HINT, explain, redact
from workers.protocol.spec import RunSpec


def test_redis_url_from_the_environment_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://example:6380/2")
    choice = defaults.redis_url(tmp_path)
    assert (choice.url, choice.embedded, choice.started) == (
        "redis://example:6380/2",
        False,
        False,
    )
    assert not (tmp_path / "redis").exists()  # nothing started


def test_without_a_running_server_and_start_false(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(defaults.DefaultsError, match="No embedded Redis is running"):
        defaults.redis_url(tmp_path, start=False)
    assert defaults.running_embedded(tmp_path) is None
    assert defaults.stop_embedded(tmp_path) is None


def test_a_stale_record_is_not_reused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "redis").mkdir()
    (tmp_path / "redis" / "server.json").write_text('{"pid": 999999999, "port": 1}')
    assert defaults.running_embedded(tmp_path) is None
    assert defaults.stop_embedded(tmp_path) is None
    assert not (tmp_path / "redis" / "server.json").exists()


def test_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOOLLOOP_HOME", str(tmp_path / "home"))
    assert defaults.state_dir() == tmp_path / "home"
    monkeypatch.delenv("TOOLLOOP_HOME")
    assert defaults.state_dir() == Path.cwd() / ".toolloop"


def test_provider_keys_and_the_simulator_env() -> None:
    assert not defaults.has_provider_key({"OPENAI_API_KEY": "x", "FAL_KEY": ""})
    assert defaults.has_provider_key({"FAL_KEY": "k"})
    env = defaults.simulated_provider_env("http://127.0.0.1:9")
    assert env == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
        "ANTHROPIC_API_KEY": defaults.SIMULATED_KEY,
    }


def test_redact_hides_the_password() -> None:
    assert redact("redis://:s3cret@host:6380/1") == "redis://:***@host:6380/1"
    assert redact("redis://user:s3cret@host/0") == "redis://user:***@host/0"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_explain_gives_two_lines_for_any_error() -> None:
    assert explain(ValueError("boom")) == f"ValueError: boom\n{DEBUG_HINT}"
    assert (
        explain(RuntimeError("What happened.\nWhat to do."))
        == "What happened.\n  What to do."
    )
    with pytest.raises(pydantic.ValidationError) as caught:
        RunSpec.model_validate({"model": "", "messages": []})
    lines = explain(caught.value).splitlines()
    assert len(lines) == 2 and lines[0].startswith("Invalid input: model:")
