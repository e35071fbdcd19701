"""Errors raised by toolloop.

    ToolloopError
    ├── AbortError                      the caller's signal was aborted (raised unchanged everywhere)
    ├── ToolArgumentsError              the model sent tool arguments that are not JSON; never retried
    └── PromptGenError                  a model call failed (carries `status`, `retryable`, `retry_after`)
        ├── PromptGenUnavailableError   the provider cannot serve at all (`reason`); the fallback moves on
        ├── PromptGenTimeoutError       the provider did not answer in time, retried once already:
                                        the fallback moves on (each attempt may have been billed)
        └── SpendLimitError             a 429 for a spend limit (`error_code`): never retried, and no
                                        fallback either (`unavailable = False`): raise the limit first

Every message has the same shape: the first line says what happened, the second (indented two
spaces) says what to do. Each error keeps its constructor arguments in `args`, so it survives
pickling and Celery's JSON error transport (which rebuilds an error as `cls(*args)`); `str()` gives
the message.
"""

from __future__ import annotations

from typing import Any, Literal

UnavailableReason = Literal["missing", "auth", "limit", "unsupported"]

_UNAVAILABLE_STATUSES = frozenset({401, 402, 403, 429})


class ToolloopError(Exception):
    """Base class of every toolloop error."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__


class AbortError(ToolloopError):
    """The caller's abort signal was aborted; `reason` is what `abort(reason)` was given."""

    def __init__(
        self, message: str = "The operation was aborted.", reason: Any = None
    ) -> None:
        super().__init__(message, reason)
        self.reason = reason


class ToolArgumentsError(ToolloopError):
    """The model sent tool arguments that are not JSON. `raw` is the full text."""

    def __init__(self, tool_name: str, raw: str) -> None:
        super().__init__(tool_name, raw)
        self.tool_name = tool_name
        self.raw = raw

    def __str__(self) -> str:
        return (
            f'Tool call "{self.tool_name}" has arguments that are not JSON.\n'
            f"  The model sent: {self.raw[:200]}."
        )


class PromptGenError(ToolloopError):
    """A model call failed. `status` is the HTTP status when there was one; `retryable` says whether
    the same request may succeed later; `retry_after` (seconds) is the provider's own hint.
    `cut_attempts`: the streamed attempts of the failed call that were cut mid-answer, priced
    (`toolloop.providers.cutcost.Cut`), so a provider that answers after a fallback counts them; an
    attribute, not an argument: pickling keeps it, Celery's JSON transport drops it."""

    cut_attempts: tuple[Any, ...] = ()

    def __init__(
        self,
        message: str,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status, retryable, retry_after)
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after


class PromptGenUnavailableError(PromptGenError):
    """The provider cannot serve at all: `reason` is "missing", "auth", "limit" or "unsupported"."""

    unavailable = True

    def __init__(
        self, message: str, reason: UnavailableReason, status: int | None = None
    ) -> None:
        Exception.__init__(self, message, reason, status)
        self.status = status
        self.retryable = False
        self.retry_after = None
        self.reason: UnavailableReason = reason


class PromptGenTimeoutError(PromptGenError):
    """A model call timed out (no answer within its wait, or nothing more of a streamed answer
    within the idle timeout) on every attempt it was allowed (toolloop/providers/timeouts.py): a
    capacity error, on which the fallback moves on. Retryable: the same request may succeed later."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.status = None
        self.retryable = True
        self.retry_after = None


class SpendLimitError(PromptGenError):
    """HTTP 429 whose `error.details.error_code` is a spend limit (`contract_spend_limit_reached`,
    `enforced_spend_limit_reached`): waiting does not help, and another provider bills the same
    organisation's budget in spirit, so the run stops with this error."""

    unavailable = False

    def __init__(self, message: str, error_code: str, status: int | None = 429) -> None:
        Exception.__init__(self, message, error_code, status)
        self.error_code = error_code
        self.status = status
        self.retryable = False
        self.retry_after = None


def is_prompt_gen_unavailable(error: BaseException) -> bool:
    """True when the error says the provider cannot serve (so a fallback may try the next one). An
    error whose `unavailable` is False (a spend limit) is not, whatever its status."""
    flag = getattr(error, "unavailable", None)
    if isinstance(flag, bool):
        return flag
    status = getattr(error, "status", None)
    return isinstance(status, int) and status in _UNAVAILABLE_STATUSES
