"""The simulator's request checks without a server: strict mode's SDK validation and the
catalogue's rules (toolloop/sim/sdk_check.py, toolloop/sim/rules.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from toolloop.providers import ModelInfo, ModelPrice, default_catalog
from toolloop.sim.rules import SimRefusal, check_anthropic, check_fal
from toolloop.sim.sdk_check import SdkValidationError, sdk_validator

GOOD: dict[str, Any] = {
    "model": "claude-sonnet-5-5",
    "max_tokens": 10,
    "messages": [{"role": "user", "content": "Hi"}],
}


def test_the_validator_accepts_a_valid_body_and_refuses_a_wrong_field() -> None:
    validate = sdk_validator()
    assert validate is not None, "the anthropic SDK (a dev dependency) is not installed"
    validate(GOOD)
    with pytest.raises(
        SdkValidationError, match="temprature: Extra inputs are not permitted"
    ):
        validate({**GOOD, "temprature": 0.2})
    with pytest.raises(
        SdkValidationError, match="temperature: Extra inputs are not permitted"
    ):
        validate({**GOOD, "temperature": 0.2})  # the SDK 2.14 has no temperature
    with pytest.raises(SdkValidationError, match=r"thinking\.budget: Extra inputs"):
        validate({**GOOD, "thinking": {"type": "adaptive", "budget": 5}})
    bad_block = [
        {"role": "user", "content": [{"type": "text", "text": "x", "cache": True}]}
    ]
    with pytest.raises(
        SdkValidationError, match=r"messages\.0\.content\.0\.cache: Extra inputs"
    ):
        validate({**GOOD, "messages": bad_block})
    with pytest.raises(SdkValidationError, match="max_tokens: Field required"):
        validate({k: v for k, v in GOOD.items() if k != "max_tokens"})


def test_retired_and_unknown_models_are_404s_unless_registered() -> None:
    for model in ("claude-sonnet-4-5", "claude-sonnet-4-5-20250929", "claude-nope"):
        with pytest.raises(SimRefusal) as caught:
            check_anthropic({**GOOD, "model": model}, default_catalog())
        assert (caught.value.status, caught.value.message) == (404, f"model: {model}")
    mine = default_catalog().with_models(
        ModelInfo(id="claude-nope", price=ModelPrice(1, 1, 0.1, 1.25))
    )
    check_anthropic({**GOOD, "model": "claude-nope"}, mine)
    with pytest.raises(SimRefusal):
        check_fal(
            {"model": "anthropic/claude-sonnet-4.5", "messages": []}, default_catalog()
        )
    # other vendors pass
    check_fal({"model": "acme/anything", "messages": []}, default_catalog())


def test_a_tool_result_needs_its_tool_use_in_the_previous_assistant_turn() -> None:
    use = {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1"}
    paired = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    check_anthropic({**GOOD, "messages": paired}, default_catalog())
    late = [
        *paired,
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [result]},
    ]
    with pytest.raises(
        SimRefusal, match=r"messages\.4\.content\.0: unexpected `tool_use_id`"
    ):
        check_anthropic({**GOOD, "messages": late}, default_catalog())


def test_without_the_sdk_strict_mode_is_off_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import toolloop.sim.app as app

    # as if `anthropic` were not installed
    monkeypatch.setattr(app, "sdk_validator", lambda: None)
    with caplog.at_level(logging.WARNING, "toolloop.sim"):
        simulator = app.Simulator(lambda request: "Hi.", strict=True)
    assert simulator.strict is False and simulator.stats()["strict"] is False
    assert "strict mode is off: the anthropic SDK is not installed" in caplog.text


def test_strict_mode_checks_a_streamed_body_against_the_sdk_streaming_params() -> None:
    validate = sdk_validator()
    assert validate is not None  # the SDK is a dev dependency
    body = {
        "model": "claude-sonnet-5-5",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    validate(body)
    validate({**body, "stream": True})
    validate({**body, "stream": False})
    with pytest.raises(SdkValidationError, match="stream"):
        validate({**body, "stream": "yes"})
    with pytest.raises(
        SdkValidationError, match="stream_options"
    ):  # fal's option, not the Messages API's
        validate({**body, "stream": True, "stream_options": {"include_usage": True}})
