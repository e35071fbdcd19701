"""Errors of the `toolloop` command, and the two-line message for any other error that reaches it."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pydantic
import redis

DEBUG_HINT = "  Set TOOLLOOP_DEBUG=1 and run it again to see the traceback."


class CliError(Exception):
    """A failure the user can fix: `message` is two lines, what happened and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def redact(url: str) -> str:
    """A Redis URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (
        f":{parts.port}" if parts.port else ""
    )
    return urlunsplit(parts._replace(netloc=netloc))


def validation_lines(error: pydantic.ValidationError, limit: int = 3) -> str:
    """The first few errors of a pydantic validation on one line: `field: message; ...`."""
    items = []
    for item in error.errors()[:limit]:
        where = ".".join(str(part) for part in item["loc"]) or "spec"
        items.append(f"{where}: {item['msg']}")
    more = (
        f" (and {error.error_count() - limit} more)"
        if error.error_count() > limit
        else ""
    )
    return "; ".join(items) + more


def explain(error: BaseException) -> str:
    """Two lines for an error the command did not turn into a CliError itself."""
    if isinstance(
        error, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError
    ):
        return (
            f"Lost the connection to Redis: {error}.\n"
            "  Check that the server is running (REDIS_URL, or `toolloop up` for the embedded one)."
        )
    if isinstance(error, pydantic.ValidationError):
        return f"Invalid input: {validation_lines(error)}.\n  Fix these fields and run the command again."
    text = str(error).strip()
    if "\n" in text:  # our own errors already have the two-line shape
        first, second = text.split("\n", 1)
        return f"{first}\n{second if second.startswith('  ') else '  ' + second}"
    return f"{type(error).__name__}: {text or 'no message'}\n{DEBUG_HINT}"
