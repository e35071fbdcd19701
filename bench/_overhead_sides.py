"""The three sides of bench/loop_overhead.py, each written the way its library's docs show.

One `Script` drives every side: model turn i (1-based) calls `add` (odd i) or `echo` (even i) with a
small input, and turn 20 answers `FINAL` with no tool call. The model function and the tools only
read the script and count; they cost the same few microseconds on every side. Peers are imported
lazily, so `--sides ours` runs without them installed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

TURNS = 20
TOOL_CALLS = TURNS - 1
FINAL = f"Done: {TOOL_CALLS} tools ran."
SYSTEM = "You are a calculator. Use the tools."
USER = "Add and echo, one tool per turn."


class Script:
    """The scripted conversation, shared by the model function and the tools of one side."""

    def __init__(self) -> None:
        self.model_calls = 0
        self.tool_runs = 0

    def reset(self) -> None:
        self.model_calls = 0
        self.tool_runs = 0

    def next_turn(self) -> tuple[str, dict[str, Any], str] | None:
        """The next model answer: `(tool name, arguments, call id)`, or None for the final text."""
        self.model_calls += 1
        turn = self.model_calls
        if turn >= TURNS:
            return None
        if turn % 2:
            return "add", {"a": turn, "b": 1}, f"call_{turn}"
        return "echo", {"text": f"turn {turn}"}, f"call_{turn}"

    def add(self, a: int, b: int) -> int:
        self.tool_runs += 1
        return a + b

    def echo(self, text: str) -> str:
        self.tool_runs += 1
        return text


def build_side(name: str, script: Script) -> Callable[[], Awaitable[str]]:
    """A coroutine function that runs one whole conversation and returns its final text."""
    builders = {"ours": _ours, "pydantic-ai": _pydantic_ai, "langgraph": _langgraph}
    return builders[name](script)


def _ours(script: Script) -> Callable[[], Awaitable[str]]:
    from pydantic import BaseModel

    from toolloop import (
        AbortSignal,
        Budget,
        MemoryJournal,
        PromptGenRequest,
        PromptGenResult,
        RunToolLoopOptions,
        TextPart,
        ToolCall,
        ToolOutput,
        ToolSpec,
        UserMessage,
        run_tool_loop,
    )

    class AddInput(BaseModel):
        a: int
        b: int

    class EchoInput(BaseModel):
        text: str

    async def add(input: AddInput, signal: AbortSignal) -> ToolOutput:
        total = script.add(input.a, input.b)
        return ToolOutput(value=total, content=[TextPart(text=str(total))])

    async def echo(input: EchoInput, signal: AbortSignal) -> ToolOutput:
        text = script.echo(input.text)
        return ToolOutput(value=text, content=[TextPart(text=text)])

    async def generate(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        turn = script.next_turn()
        if turn is None:
            return PromptGenResult(text=FINAL, finish_reason="stop")
        tool, args, call_id = turn
        return PromptGenResult(
            tool_calls=[ToolCall(id=call_id, name=tool, input=args)],
            finish_reason="tool_calls",
        )

    tools = [
        ToolSpec(name="add", description="Add two integers.", schema=AddInput, run=add),
        ToolSpec(
            name="echo", description="Echo a text back.", schema=EchoInput, run=echo
        ),
    ]
    messages = [UserMessage(content=USER)]

    async def conversation() -> str:
        result = await run_tool_loop(
            RunToolLoopOptions(
                generate=generate,
                model="scripted",
                system=SYSTEM,
                messages=messages,
                tools=tools,
                budget=Budget(usd=1.0),
                max_steps=TURNS + 5,
                step=MemoryJournal().step,
            )
        )
        assert result.stopped_by == "done" and result.steps == TURNS, result.stopped_by
        return result.final_text or ""

    return conversation


def _pydantic_ai(script: Script) -> Callable[[], Awaitable[str]]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = script.next_turn()
        if turn is None:
            return ModelResponse(parts=[TextPart(FINAL)])
        tool, args, call_id = turn
        return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=call_id)])

    agent = Agent(FunctionModel(model), system_prompt=SYSTEM)

    @agent.tool_plain
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return script.add(a, b)

    @agent.tool_plain
    async def echo(text: str) -> str:
        """Echo a text back."""
        return script.echo(text)

    async def conversation() -> str:
        result = await agent.run(USER)
        return result.output

    return conversation


def _langgraph(script: Script) -> Callable[[], Awaitable[str]]:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
    )
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    class ScriptedChatModel(BaseChatModel):
        """A chat model that answers from the script; `bind_tools` binds like a real provider's."""

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

        def _generate(
            self, messages: list[BaseMessage], *args: Any, **kwargs: Any
        ) -> ChatResult:
            turn = script.next_turn()
            if turn is None:
                message = AIMessage(content=FINAL)
            else:
                tool_name, args_, call_id = turn
                message = AIMessage(
                    content="",
                    tool_calls=[{"name": tool_name, "args": args_, "id": call_id}],
                )
            return ChatResult(generations=[ChatGeneration(message=message)])

        async def _agenerate(
            self, messages: list[BaseMessage], *args: Any, **kwargs: Any
        ) -> ChatResult:
            return self._generate(messages)

    @tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return script.add(a, b)

    @tool
    async def echo(text: str) -> str:
        """Echo a text back."""
        return script.echo(text)

    tools = [add, echo]
    model = ScriptedChatModel().bind_tools(tools)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {
            "messages": [
                await model.ainvoke([SystemMessage(SYSTEM), *state["messages"]])
            ]
        }

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile()
    config = {"recursion_limit": 2 * TURNS + 5}

    async def conversation() -> str:
        state = await graph.ainvoke({"messages": [HumanMessage(USER)]}, config)
        return str(state["messages"][-1].content)

    return conversation
