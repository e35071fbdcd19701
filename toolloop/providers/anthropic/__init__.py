"""The Anthropic Messages API provider: request mapping, response mapping, the handler."""

from toolloop.providers.anthropic.handler import AnthropicHandler
from toolloop.providers.anthropic.request import build_body
from toolloop.providers.anthropic.response import parse_message

__all__ = ["AnthropicHandler", "build_body", "parse_message"]
