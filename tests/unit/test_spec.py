"""RunSpec validation, toolset resolution and the workers' errors (no Redis, no worker)."""

from __future__ import annotations

import pickle
import sys
import types

import pydantic
import pytest
from pydantic import BaseModel

from toolloop import ToolOutput, ToolSpec, UserMessage
from workers.config import toolsets
from workers.protocol.errors import RunNotFoundError, ToolsetError
from workers.protocol.spec import RunSpec

MESSAGES = [{"role": "user", "content": "Hi"}]


class Empty(BaseModel):
    pass


def _tool(name: str) -> ToolSpec:
    return ToolSpec(
        name=name, description=name, schema=Empty, run=lambda _i, _s: ToolOutput()
    )


def test_a_spec_is_validated_and_gets_defaults() -> None:
    spec = RunSpec.model_validate(
        {"model": "m", "messages": MESSAGES, "toolset": "review"}
    )
    assert spec.messages == [UserMessage(content="Hi")]
    assert (
        spec.budget_usd,
        spec.finish_at,
        spec.max_steps,
        spec.keep_images,
        spec.cache,
    ) == (
        1.0,
        1.0,
        20,
        2,
        "conversation",
    )
    assert RunSpec.model_validate_json(spec.model_dump_json()) == spec


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"messages": []}, "messages"),
        ({"model": ""}, "model"),
        ({"budget_usd": 0}, "budget_usd"),
        ({"finish_at": 1.5}, "finish_at"),
        ({"max_steps": 0}, "max_steps"),
        ({"cache": "all"}, "cache"),
        ({"toolset": ""}, "toolset"),
        ({"toolset": "x" * 201}, "toolset"),
        ({"api_key": "sk-secret"}, "api_key"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"provider": "nosuch"}, "'nosuch' is not a provider; use one of anthropic"),
        ({"fallback": ["anthropic", "nosuch"]}, "fallback"),
        ({"keep_images": -2}, "keep_images"),
    ],
)
def test_a_bad_spec_names_the_bad_field(change: dict[str, object], where: str) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        RunSpec.model_validate({"model": "m", "messages": MESSAGES, **change})
    assert where in str(caught.value)


def test_the_providers_a_spec_may_name_are_those_the_workers_have() -> None:
    from toolloop.providers import from_env
    from workers.protocol.spec import provider_names

    assert (
        provider_names() == from_env({}).providers() and "anthropic" in provider_names()
    )
    for name in provider_names():
        assert (
            RunSpec.model_validate(
                {"model": "m", "messages": MESSAGES, "provider": name}
            ).provider
            == name
        )


@pytest.fixture
def toolset_module() -> types.ModuleType:
    module = types.ModuleType("toolset_for_tests")
    module.TOOLS = [_tool("a"), _tool("b")]  # type: ignore[attr-defined]
    module.make = lambda: [_tool("c")]  # type: ignore[attr-defined]
    module.NOT_TOOLS = ["a"]  # type: ignore[attr-defined]
    module.TWICE = [_tool("a"), _tool("a")]  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_a_toolset_resolves_from_a_list_or_a_callable(
    toolset_module: types.ModuleType,
) -> None:
    registry = toolsets.Registry(
        {"listed": "toolset_for_tests:TOOLS", "made": "toolset_for_tests:make"}
    )
    assert [t.name for t in registry.resolve("listed")] == ["a", "b"]
    assert [t.name for t in registry.resolve("made")] == ["c"]
    assert registry.resolve(None) == []


@pytest.mark.parametrize(
    ("path", "says"),
    [
        (
            "no_such_module_here:TOOLS",
            "Cannot import the module of toolset 'x' ('no_such_module_here:TOOLS')",
        ),
        ("toolset_for_tests:MISSING", "has no 'MISSING'"),
        ("toolset_for_tests:NOT_TOOLS", "is a list, not a list of ToolSpec"),
        ("toolset_for_tests:TWICE", "more than one tool named 'a'"),
    ],
)
def test_a_bad_toolset_says_what_and_what_to_do(
    toolset_module: types.ModuleType, path: str, says: str
) -> None:
    with pytest.raises(ToolsetError) as caught:
        toolsets.Registry({"x": path}).resolve("x")
    first, second = str(caught.value).split("\n")
    assert says in first
    assert second.startswith("  ")


def test_errors_survive_pickling() -> None:
    error = pickle.loads(pickle.dumps(RunNotFoundError("abc")))
    assert isinstance(error, RunNotFoundError) and error.run_id == "abc"
    assert str(error).startswith("No run has the id 'abc'.")
