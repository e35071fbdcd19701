"""Providers (SPEC section 3): the `PromptGen` facade with fallback, and one handler per provider."""

from toolloop.http import HttpClient, HttpxClient, KeepAliveClient, client_from_env
from toolloop.providers.anthropic import AnthropicHandler
from toolloop.providers.base import PromptGenHandler, Secret
from toolloop.providers.catalog import Catalog, ModelInfo, ModelPrice, Source
from toolloop.providers.env import from_env
from toolloop.providers.facade import PromptGen
from toolloop.providers.fal import FalHandler
from toolloop.providers.models import default_catalog
from toolloop.providers.oneturn import ClaudeHandler, CodexHandler, OpenAIHandler
from toolloop.providers.retry import RetryPolicy

__all__ = [
    "AnthropicHandler",
    "Catalog",
    "ClaudeHandler",
    "CodexHandler",
    "FalHandler",
    "HttpClient",
    "HttpxClient",
    "KeepAliveClient",
    "ModelInfo",
    "ModelPrice",
    "OpenAIHandler",
    "PromptGen",
    "PromptGenHandler",
    "RetryPolicy",
    "Secret",
    "Source",
    "client_from_env",
    "default_catalog",
    "from_env",
]
