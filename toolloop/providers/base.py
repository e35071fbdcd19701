"""What every provider shares: the `PromptGenHandler` protocol and `Secret`, the key holder.

Invariant: an API key lives only inside a `Secret`. Its `repr`/`str` never show the value, so a
handler's repr, a log line or an error message built from it cannot leak the key; the value is
read with `reveal()` only where a request header is built.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from toolloop.abort import AbortSignal
from toolloop.contract import OnDelta, PromptGenRequest, PromptGenResult
from toolloop.errors import PromptGenUnavailableError


@runtime_checkable
class PromptGenHandler(Protocol):
    """One provider. `estimate` is the USD cost ceiling of a request, without network; `execute`
    makes the call. Both raise `PromptGenUnavailableError(reason="unsupported")` for a request the
    provider cannot express, before any call. A handler that streams calls `on_delta` with each text
    or thinking delta as it arrives (SPEC 4.3) and returns the same result as without it; a handler
    whose `execute` takes no `on_delta` still serves (the facade calls it without one)."""

    def estimate(self, request: PromptGenRequest) -> float: ...

    async def execute(
        self,
        request: PromptGenRequest,
        signal: AbortSignal,
        on_delta: OnDelta | None = None,
    ) -> PromptGenResult: ...


class Secret:
    """An API key. Shows as `Secret('***')` (or `Secret(None)` when unset), never as its value."""

    __slots__ = ("_value",)

    def __init__(self, value: str | None) -> None:
        self._value = value or None

    def reveal(self) -> str | None:
        return self._value

    def required(self, provider: str, env: str) -> str:
        """The key, or PromptGenUnavailableError ("auth") naming the variable that sets it."""
        if self._value is None:
            raise PromptGenUnavailableError(
                f"{provider} has no API key.\n"
                f"  Set {env}, or use another prompt-gen provider.",
                "auth",
            )
        return self._value

    def __bool__(self) -> bool:
        return self._value is not None

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret(None)"

    __str__ = __repr__

    def __reduce__(self) -> tuple[type[Secret], tuple[None]]:
        # A pickled handler (a Celery argument, a crash dump) never carries the key.
        return (Secret, (None,))


def redact(text: str, *secrets: Secret) -> str:
    """`text` with every secret value replaced by `***` (for messages built from server answers)."""
    for secret in secrets:
        value = secret.reveal()
        if value:
            text = text.replace(value, "***")
    return text
