"""fal's OpenAI-compatible router provider: request mapping, response mapping, the handler."""

from toolloop.providers.fal.handler import FalHandler
from toolloop.providers.fal.request import build_body

__all__ = ["FalHandler", "build_body"]
