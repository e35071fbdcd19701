"""Providers (SPEC section 3): the `PromptGen` facade with fallback, and one handler per provider."""

from toolloop.providers.anthropic import AnthropicHandler
from toolloop.providers.base import PromptGenHandler, Secret
from toolloop.providers.env import from_env
from toolloop.providers.facade import PromptGen
from toolloop.providers.fal import FalHandler
from toolloop.providers.http import RetryPolicy
from toolloop.providers.oneturn import ClaudeHandler, CodexHandler, OpenAIHandler
from toolloop.providers.prices import ModelPrice

__all__ = [
    "AnthropicHandler",
    "ClaudeHandler",
    "CodexHandler",
    "FalHandler",
    "ModelPrice",
    "OpenAIHandler",
    "PromptGen",
    "PromptGenHandler",
    "RetryPolicy",
    "Secret",
    "from_env",
]
