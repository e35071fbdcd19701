"""fal's OpenAI-compatible router provider: request mapping, response mapping, the handler."""

from toolloop.providers.fal.handler import FalHandler
from toolloop.providers.fal.request import build_body
from toolloop.providers.fal.response import parse_completion

__all__ = ["FalHandler", "build_body", "parse_completion"]
