"""The providers over real HTTP against the simulator (`toolloop.sim.SimServer` on loopback):
wire mapping, cache marks, usage and cost, every status of SPEC 3.3, abort, and fallback."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.sim import Recording
from tests.unit.providers_kit import FAKE_KEY, validate_anthropic_body
from toolloop import (
    AbortController,
    AbortError,
    AssistantMessage,
    Budget,
    ImagePart,
    MemoryJournal,
    PromptGen,
    PromptGenError,
    PromptGenRequest,
    PromptGenUnavailableError,
    RunToolLoopOptions,
    RunToolLoopResult,
    TextPart,
    ToolArgumentsError,
    ToolMessage,
    ToolOutput,
    ToolSpec,
    UserMessage,
    run_tool_loop,
)
from toolloop.errors import PromptGenTimeoutError
from toolloop.http import KeepAliveClient
from toolloop.providers import AnthropicHandler, FalHandler, ModelPrice, RetryPolicy
from toolloop.providers.timeouts import Timeouts
from toolloop.sim import SimRequest, SimServer, SimTurn

FAST = RetryPolicy(
    attempts=3,
    base_delay_s=0.02,
    max_delay_s=0.1,
    total_s=10.0,
    short_retry_after_s=1.0,
)
QUICK_ROUTE = Timeouts(whole_s=0.3, idle_s=0.3, tokens_per_hour=100_000_000)
"""A route that generates 1,000 tokens in 0.036 s: a non-streamed call waits 0.3 s (its floor)."""
# > 1,024 tokens
SYSTEM = "You review storyboards shot by shot and report what to change. " * 80
EPHEMERAL = {"type": "ephemeral"}


CLIENT: dict[str, KeepAliveClient] = {}
"""The keep-alive client of the running test, when it runs on that path (set by `http_path`)."""


@pytest.fixture(params=["per-call client", "keep-alive client"], autouse=True)
async def http_path(request: pytest.FixtureRequest) -> Any:
    """Every test runs on both HTTP paths: a client per call (a handler's own, the library's
    default) and the keep-alive client a worker hands its providers (toolloop/http/keepalive.py)."""
    if request.param == "per-call client":
        yield
        return
    client = CLIENT["client"] = KeepAliveClient()
    try:
        yield
        if CLIENT.get("client") is client:  # (a test that cannot use it took it out)
            assert client.used, (
                "the test's calls never went through the keep-alive client"
            )
    finally:
        CLIENT.pop("client", None)
        await client.aclose()


@pytest.fixture
def png(tmp_path: Path) -> Path:
    path = tmp_path / "shot3.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\nshot-3")
    return path


def serve(policy: Any, **options: Any) -> SimServer:
    return SimServer(policy, **options)


def anthropic(sim: SimServer, key: str = FAKE_KEY, **options: Any) -> AnthropicHandler:
    options.setdefault("http_client", CLIENT.get("client"))
    return AnthropicHandler(
        key, base_url=sim.base_url, retry=options.pop("retry", FAST), **options
    )


def fal(sim: SimServer, key: str = FAKE_KEY, **options: Any) -> FalHandler:
    options.setdefault("http_client", CLIENT.get("client"))
    return FalHandler(
        key, run_url=sim.base_url, retry=options.pop("retry", FAST), **options
    )


async def execute(handler: Any, request: PromptGenRequest) -> Any:
    return await handler.execute(request, AbortController().signal)


# -- wire mapping ------------------------------------------------------------------------------


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_text_tool_calls_tool_results_and_images_round_trip(
    wire: str, png: Path
) -> None:
    policy = Recording(
        [
            {
                "text": "Looking.",
                "tool_calls": [{"name": "read_frame", "input": {"shot": 3}}],
            },
            {"text": "Shot 3 is fine."},
        ]
    )
    image = ImagePart(path=str(png), mime_type="image/png", hash="h")
    with serve(policy) as sim:
        handler = anthropic(sim) if wire == "anthropic" else fal(sim)
        history: list[Any] = [
            UserMessage(content=[TextPart(text="Review shot 3."), image])
        ]
        first = await execute(
            handler, PromptGenRequest(system="Review.", messages=history)
        )
        assert first.text == "Looking." and first.finish_reason == "tool_calls"
        (call,) = first.tool_calls
        assert call.name == "read_frame" and call.input == {"shot": 3}
        assert call.id.startswith("toolu_" if wire == "anthropic" else "call_")
        history += [
            AssistantMessage(content=first.text, tool_calls=first.tool_calls),
            ToolMessage(
                tool_call_id=call.id, content=[TextPart(text="frame 3"), image]
            ),
        ]
        second = await execute(
            handler, PromptGenRequest(system="Review.", messages=history)
        )
        uploads = sim.stats().get("uploads", {})
        files = dict(sim.simulator.files)
    assert (
        second.text == "Shot 3 is fine."
        and second.finish_reason == "stop"
        and second.tool_calls == []
    )
    seen = policy.requests[1]
    assert seen.system == "Review." and seen.assistant_turns == 1
    user, assistant, tool, *shown = seen.messages
    assert isinstance(user, UserMessage) and isinstance(user.content, list)
    assert user.content[0] == TextPart(text="Review shot 3.")
    sim_image = user.content[1]
    assert isinstance(sim_image, ImagePart)
    data = png.read_bytes()
    if (
        wire == "anthropic"
    ):  # the bytes arrived: Anthropic's sim hashes the decoded bytes
        assert sim_image.mime_type == "image/png"
        assert sim_image.hash == hashlib.sha256(data).hexdigest()
    else:  # fal: uploaded once to storage (both steps, user and tool turn), sent as its file URL
        assert uploads == {"initiate": 1, "put": 1}
        ((token, (mime, stored)),) = files.items()
        assert (mime, stored) == ("image/png", data)
        assert sim_image.path.endswith("/storage/files/" + token)
        assert (
            policy.requests[0].body["messages"][1]["content"][1]["image_url"]["url"]
            == sim_image.path
        )
    assert assistant == AssistantMessage(
        content="Looking.", tool_calls=first.tool_calls
    )
    assert isinstance(tool, ToolMessage) and tool.tool_call_id == call.id
    if (
        wire == "fal"
    ):  # the tool message carries text only; its image follows in a user turn
        assert tool.content == [
            TextPart(text="frame 3"),
            TextPart(text="[image 1 of this result follows]"),
        ]
        (after,) = shown
        assert isinstance(after, UserMessage) and isinstance(after.content, list)
        assert after.content[1] == sim_image
    else:
        assert shown == []
    if wire == "anthropic":
        for request in policy.requests:
            validate_anthropic_body(request.body)


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_arguments_that_are_not_json_raise_tool_arguments_error(
    wire: str,
) -> None:
    with serve(
        [{"tool_calls": [{"name": "trim", "raw_arguments": '{"shot": 3,'}]}]
    ) as sim:
        handler = anthropic(sim) if wire == "anthropic" else fal(sim)
        with pytest.raises(ToolArgumentsError) as caught:
            await execute(handler, PromptGenRequest(prompt="Trim."))
        assert sim.stats()["requests"] == 1  # never retried
    assert caught.value.tool_name == "trim" and caught.value.raw == '{"shot": 3,'


# -- usage and cost ----------------------------------------------------------------------------


async def test_anthropic_usage_and_cost_from_tokens_with_cache_rates() -> None:
    with serve(Recording(["One.", "Two."])) as sim:
        handler = anthropic(sim)
        history: list[Any] = [UserMessage(content="Go.")]
        first = await execute(
            handler,
            PromptGenRequest(system=SYSTEM, cache_system=True, messages=history),
        )
        history += [AssistantMessage(content="One."), UserMessage(content="Again.")]
        second = await execute(
            handler,
            PromptGenRequest(system=SYSTEM, cache_system=True, messages=history),
        )
    assert first.usage.cache_write_tokens > 1024 and first.usage.cached_tokens == 0
    # the system prefix was read
    assert second.usage.cached_tokens == first.usage.cache_write_tokens
    assert second.usage.cached_read_tokens == second.usage.cached_tokens
    for result in (first, second):
        usage = result.usage
        uncached = usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens
        # claude-sonnet-5-5 (the default): $2/M input, $10/M output, read $0.10/M (its migration
        # guide), 5m write $2.50/M
        expected = (
            uncached * 2
            + usage.completion_tokens * 10
            + usage.cached_tokens * 0.1
            + usage.cache_write_tokens * 2.5
        ) / 1e6
        assert result.cost_usd == pytest.approx(expected)
        assert result.meta is not None and result.meta["cost_source"] == "tokens"
    # reads cost a tenth of input, writes more than input
    assert second.cost_usd < first.cost_usd / 3


async def test_fal_cost_from_the_reported_figure_and_from_tokens_with_cache_rates() -> (
    None
):
    request = PromptGenRequest(
        system=SYSTEM, cache_system=True, messages=[UserMessage(content="Go.")]
    )
    with serve(["Done."]) as sim:
        # opus 5.5's
        handler = fal(
            sim, prices={"acme/unpriced-at-fal": ModelPrice(4, 20, 0.2, 5, 8)}
        )
        reported = await execute(handler, request)
        # reads the cache written by the first call
        again = await execute(handler, request)
        by_tokens = await execute(
            handler, request.model_copy(update={"model": "acme/unpriced-at-fal"})
        )
    assert reported.meta is not None and reported.meta["cost_source"] == "usage"
    assert (
        again.usage.cached_tokens > 1024
        and again.usage.cached_read_tokens == again.usage.cached_tokens
    )
    assert by_tokens.meta is not None and by_tokens.meta["cost_source"] == "tokens"
    # Our token pricing of the same usage matches the figure the simulator reports for the same rates.
    assert (
        by_tokens.usage.cache_write_tokens == reported.usage.cache_write_tokens > 1024
    )
    assert by_tokens.cost_usd == pytest.approx(reported.cost_usd, abs=1e-6)


# -- cache marks through run_tool_loop ----------------------------------------------------------


class Shot(BaseModel):
    shot: int


def read_frame_tool() -> ToolSpec:
    def run(input: Shot, signal: Any) -> ToolOutput:
        return ToolOutput(
            value=input.shot,
            content=[TextPart(text=f"frame {input.shot}: a wide shot")],
        )

    return ToolSpec(
        name="read_frame", description="Read one frame of a shot.", schema=Shot, run=run
    )


def frame_turns(count: int) -> list[Any]:
    return [
        {"text": "", "tool_calls": [{"name": "read_frame", "input": {"shot": n}}]}
        for n in range(count)
    ] + ["All frames read."]


async def loop(
    handler: Any, cache: str, first_message: Any, steps: int = 10
) -> RunToolLoopResult:
    options = RunToolLoopOptions(
        generate=PromptGen({"p": handler}, "p").as_generate(),
        model="claude-sonnet-5-5"
        if isinstance(handler, AnthropicHandler)
        else "anthropic/claude-opus-5.5",
        system=SYSTEM,
        messages=[first_message],
        tools=[read_frame_tool()],
        budget=Budget(usd=10.0),
        max_steps=steps,
        step=MemoryJournal().step,
        cache=cache,  # type: ignore[arg-type]
    )
    return await run_tool_loop(options)


def marked(body: dict[str, Any]) -> list[str]:
    """Where a body carries cache_control: "system", "tool:<name>", or the marked texts."""
    if (
        "max_tokens" in body
        and body["messages"]
        and body["messages"][0]["role"] == "system"
    ):
        return _marked_fal(body)
    found = [f"tool:{t['name']}" for t in body.get("tools", []) if "cache_control" in t]
    system = body.get("system")
    found += (
        ["system" for b in system if "cache_control" in b]
        if isinstance(system, list)
        else []
    )
    for turn in body["messages"]:
        blocks = turn["content"] if isinstance(turn["content"], list) else []
        for block in blocks:
            inner = block.get("content", []) if block["type"] == "tool_result" else []
            found += [
                b.get("text", b["type"])
                for b in [block, *inner]
                if "cache_control" in b
            ]
    return found


def _marked_fal(body: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for message in body["messages"]:
        parts = message["content"] if isinstance(message["content"], list) else []
        label = "system" if message["role"] == "system" else None
        found += [label or p["text"] for p in parts if "cache_control" in p]
    return found


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_system_rolling_and_caller_marks_land_on_the_wire(wire: str) -> None:
    policy = Recording(frame_turns(5))
    caller = UserMessage(
        content=[
            TextPart(text="Review every frame.", cache=True),
            TextPart(text="Be brief."),
        ]
    )
    with serve(policy) as sim:
        result = await loop(
            anthropic(sim) if wire == "anthropic" else fal(sim), "conversation", caller
        )
    assert result.stopped_by == "done" and len(policy.requests) == 6
    marks = [marked(r.body) for r in policy.requests]
    # the caller's mark stays; the rolling mark goes on the newest stable message's last text part
    assert marks[0] == ["system", "Review every frame.", "Be brief."]
    assert marks[1] == [
        "system",
        "Review every frame.",
        "Be brief.",
        "frame 0: a wide shot",
    ]
    for n in range(
        2, 6
    ):  # the newest tool result and the one the request before marked
        assert marks[n] == [
            "system",
            "Review every frame.",
            f"frame {n - 2}: a wide shot",
            f"frame {n - 1}: a wide shot",
        ]
    if wire == "anthropic":
        for request in policy.requests:
            validate_anthropic_body(request.body)


@pytest.mark.parametrize(
    ("mode", "first"), [("system", ["system", "Review."]), ("off", ["Review."])]
)
async def test_system_and_off_modes_send_only_the_system_and_caller_marks(
    mode: str, first: list[str]
) -> None:
    policy = Recording(frame_turns(2))
    with serve(policy) as sim:
        await loop(
            anthropic(sim),
            mode,
            UserMessage(content=[TextPart(text="Review.", cache=True)]),
        )
    assert [marked(r.body) for r in policy.requests] == [first] * 3


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_conversation_marks_make_the_prompt_mostly_cached_reads(
    wire: str,
) -> None:
    with serve(frame_turns(8)) as sim:
        handler = anthropic(sim) if wire == "anthropic" else fal(sim)
        costs: list[Any] = []

        async def generate(request: PromptGenRequest, signal: Any) -> Any:
            result = await handler.execute(request, signal)
            costs.append(result.usage)
            return result

        model = (
            "claude-sonnet-5-5" if wire == "anthropic" else "anthropic/claude-opus-5.5"
        )
        options = RunToolLoopOptions(
            generate=generate,
            model=model,
            system=SYSTEM,
            messages=[UserMessage(content="Review every frame.")],
            tools=[read_frame_tool()],
            budget=Budget(usd=10.0),
            max_steps=20,
            step=MemoryJournal().step,
        )
        await run_tool_loop(options)
    later = costs[2:]
    share = sum(u.cached_tokens for u in later) / sum(u.prompt_tokens for u in later)
    assert share >= 0.9, share


# -- statuses, retries, abort, fallback -------------------------------------------------------


def fault(**spec: Any) -> list[Any]:
    return [{"text": "answered", "fault": spec}]


@pytest.mark.parametrize(
    ("spec", "requests"),
    [
        ({"status": 500, "times": 2}, 3),
        ({"status": 529, "times": 1}, 2),
        ({"status": 429, "retry_after": 0.1, "times": 1}, 2),
        ({"status": 429, "times": 1}, 2),
        ({"kind": "timeout", "seconds": 1.5, "times": 1}, 2),
    ],
    ids=["500", "529", "429-short-retry-after", "429-no-retry-after", "timeout"],
)
@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_retried_faults_then_the_answer(
    wire: str, spec: dict[str, Any], requests: int
) -> None:
    with serve(fault(**spec)) as sim:
        request = PromptGenRequest(prompt="Go", params={"max_tokens": 1000})
        make = anthropic if wire == "anthropic" else fal
        handler = make(sim, timeouts=QUICK_ROUTE)
        result = await execute(handler, request)
        assert result.text == "answered"
        assert sim.stats()["requests"] == requests


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"status": 401}, "auth"),
        ({"status": 403}, "auth"),
        ({"status": 402}, "limit"),
        ({"status": 429, "retry_after": 30}, "limit"),
        ({"status": 404}, "missing"),
    ],
    ids=["401", "403", "402", "429-long-retry-after", "404"],
)
@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_auth_and_limit_statuses_are_unavailable_without_retry(
    wire: str, spec: dict[str, Any], reason: str
) -> None:
    with serve(fault(**spec)) as sim:
        handler = anthropic(sim) if wire == "anthropic" else fal(sim)
        with pytest.raises(PromptGenUnavailableError) as caught:
            await execute(handler, PromptGenRequest(prompt="Go"))
        assert sim.stats()["requests"] == 1
    assert caught.value.reason == reason and caught.value.status == spec["status"]


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_a_refusal_is_finish_reason_refusal_without_tool_calls(wire: str) -> None:
    turn = {
        "text": "",
        "tool_calls": [{"name": "trim", "input": {}}],
        "fault": {"kind": "refusal"},
    }
    with serve([turn]) as sim:
        handler = anthropic(sim) if wire == "anthropic" else fal(sim)
        result = await execute(handler, PromptGenRequest(prompt="Go"))
    assert result.finish_reason == "refusal" and result.tool_calls == []


async def test_persistent_5xx_is_bounded_in_attempts() -> None:
    with serve(fault(status=529, times=None)) as sim:
        with pytest.raises(PromptGenError) as caught:
            await execute(anthropic(sim), PromptGenRequest(prompt="Go"))
        assert sim.stats()["requests"] == FAST.attempts
    assert caught.value.status == 529 and caught.value.retryable
    assert "overloaded_error" in str(caught.value) and "(3 attempts)" in str(
        caught.value
    )


async def test_persistent_timeouts_are_tried_twice_then_raised_as_a_timeout() -> None:
    policy = RetryPolicy(attempts=10, base_delay_s=0.05, total_s=5)
    with serve(fault(kind="timeout", seconds=2.0, times=None)) as sim:
        started = time.monotonic()
        request = PromptGenRequest(prompt="Go", params={"max_tokens": 1000})
        with pytest.raises(
            PromptGenTimeoutError, match=r"did not answer within 0\.3 s \(2 attempts\)"
        ):
            await execute(anthropic(sim, timeouts=QUICK_ROUTE, retry=policy), request)
        assert time.monotonic() - started < 3.0
        # each may have been billed: one retry, not nine
        assert sim.stats()["requests"] == 2


async def test_a_connection_dropped_before_any_response_is_retried_then_an_error() -> (
    None
):
    with serve(fault(kind="drop", times=None)) as sim:
        with pytest.raises(PromptGenError, match="could not be reached") as caught:
            await execute(anthropic(sim), PromptGenRequest(prompt="Go"))
        # retried with backoff, as the SDK does
        assert sim.stats()["requests"] == FAST.attempts
    assert not isinstance(
        caught.value, PromptGenUnavailableError | PromptGenTimeoutError
    )


async def test_a_bad_request_is_400_without_retry() -> None:
    too_many = [TextPart(text=f"part {n}", cache=True) for n in range(5)]
    with serve(["ok"]) as sim:
        with pytest.raises(PromptGenError) as caught:
            await execute(
                anthropic(sim),
                PromptGenRequest(messages=[UserMessage(content=too_many)]),
            )
        assert sim.stats()["requests"] == 1
    assert (
        caught.value.status == 400
        and "maximum of 4 blocks with cache_control" in str(caught.value)
    )


@pytest.mark.parametrize("where", ["request", "backoff"])
async def test_the_callers_abort_is_raised_unchanged_at_once(where: str) -> None:
    spec = (
        {"kind": "timeout", "seconds": 3.0}
        if where == "request"
        else {"status": 503, "retry_after": 3}
    )
    with serve(fault(**spec, times=None)) as sim:
        controller = AbortController()
        asyncio.get_running_loop().call_later(
            0.3, controller.abort, "user pressed stop"
        )
        started = time.monotonic()
        slow = RetryPolicy(attempts=5, total_s=60)
        with pytest.raises(AbortError) as caught:
            await anthropic(sim, retry=slow).execute(
                PromptGenRequest(prompt="Go"), controller.signal
            )
        assert time.monotonic() - started < 1.5
    assert caught.value.reason == "user pressed stop"


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_refusals_fall_back_to_the_next_provider(status: int) -> None:
    def policy(request: SimRequest) -> SimTurn:
        if request.wire == "anthropic":
            return SimTurn(fault={"status": status, "times": None})  # type: ignore[arg-type]
        return SimTurn(text="fal answered")

    with serve(policy) as sim:
        gen = PromptGen(
            {"anthropic": anthropic(sim), "fal": fal(sim)}, "anthropic", ["fal"]
        )
        result = await gen.generate(PromptGenRequest(prompt="Go"))
        assert sim.stats()["endpoints"] == {"anthropic": 1, "fal": 1}
    assert (
        result.text == "fal answered"
        and result.meta is not None
        and result.meta["provider"] == "fal"
    )


async def test_a_wrong_key_is_auth_and_never_shows_in_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        serve(["ok"], require_key="the-right-key") as sim,
        caplog.at_level("DEBUG"),
        pytest.raises(PromptGenUnavailableError) as caught,
    ):
        await execute(anthropic(sim, key=FAKE_KEY), PromptGenRequest(prompt="Go"))
    assert caught.value.reason == "auth" and "ANTHROPIC_API_KEY" in str(caught.value)
    assert FAKE_KEY not in str(caught.value) and FAKE_KEY not in caplog.text


@pytest.fixture(autouse=True)
def _no_leftover_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("ANTHROPIC_API_KEY", "FAL_KEY", "ANTHROPIC_BASE_URL", "FAL_RUN_URL"):
        monkeypatch.delenv(name, raising=False)
    yield
