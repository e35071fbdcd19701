"""The tool-calling loop: `run_tool_loop` and its types."""

from toolloop.loop.run import run_tool_loop

__all__ = ["run_tool_loop"]
