"""What clients read back: `RunStatus` (the state hash) and `RunEventRecord` (one stream entry)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Status = Literal[
    "queued",
    "running",
    "asked",
    "waiting",
    "done",
    "budget",
    "steps",
    "cancel",
    "refused",
    "failed",
    "expired",
    "interrupted",
]
FINAL: frozenset[str] = frozenset(
    {"done", "budget", "steps", "cancel", "refused", "failed", "expired", "interrupted"}
)
"""A run in one of these has stopped; `done` and `interrupted` ones take a follow-up
(workers/client/talk.py)."""
RUN_EVENT_KINDS: frozenset[str] = frozenset(
    {
        "queued",
        "parked",
        "answered",
        "resumed",
        "finished",
        "failed",
        "approval_requested",
        "approval_decided",
        "approval_refused",
        "approval_expired",
        "expired",
        "follow_up",
        "steer_sent",
        "child_started",
        "waiting",
        "child_finished",
        "woken",
        "child_asked",
    }
)
"""Run-level events; the others are the loop's own (`model`, `tool`, `budget`)."""


class RunStatus(BaseModel):
    """A run's state. `asked` is the held ask's input while `status == "asked"`; `segment` counts
    the answered asks; `error_class` / `error_message` are set when `status == "failed"`;
    `refusal` (`category`, `explanation`) when the model refused (`status == "refused"`)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    status: Status
    segment: int = 0
    steps: int = 0
    spent_usd: float = 0.0
    final_text: str | None = None
    asked: dict[str, Any] | None = None
    approvals: list[dict[str, Any]] | None = None
    """While the run waits for decisions: the held calls (`call_id`, `name`, `input`, `input_digest`,
    `estimate_usd`, `deadline` (unix s or None), `default`)."""
    ask_deadline: float | None = None
    error_class: str | None = None
    error_message: str | None = None
    refusal: dict[str, Any] | None = None
    account_stop: dict[str, Any] | None = None
    """When a shared account's limit stopped the run (`status == "budget"`): the account's `name`,
    `period`, `period_id`, `limit_usd` and `spent_usd` (its spend when it stopped)."""
    cancel_requested: bool = False
    created_at: float | None = None
    updated_at: float | None = None
    parent: str | None = None
    """The run that spawned this one (a child run, docs/children.md); None for a root."""
    depth: int = 0
    """How deep in its tree: 0 for a root, 1 for its children, ..."""
    children: int = 0
    """How many child runs it has spawned (`Client.tree` lists them). `waiting`: it waits for them."""
    asking: str | None = None
    """While it waits on its children: the first descendant that asks a question (its id; `asked` is
    that question). `Client.answer(run_id, ...)` answers it."""

    @property
    def finished(self) -> bool:
        return self.status in FINAL


class RunNode(BaseModel):
    """One run of a tree (`Client.tree`): `parent` is None for the run asked about; `budget_usd` is a
    child's budget slice (None for that run); `asked` its question while it asks."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    parent: str | None
    status: Status
    spent_usd: float
    steps: int
    budget_usd: float | None = None
    asked: dict[str, Any] | None = None
    final_text: str | None = None


class DecisionState(BaseModel):
    """Where a decision on a held call stands (`Client.decision`): `pending` (held, no decision sent),
    `queued` (sent, no worker has applied it yet: it applies when one runs), `decided` (recorded:
    `action`, `actor`, `reason`, `input`; `early` when sent before the run parked), `expired` (the
    deadline gave it its default `action`) or `refused` (a worker refused the last decision sent,
    `why`; the call still waits for another)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    call_id: str
    state: Literal["pending", "queued", "decided", "expired", "refused"]
    name: str | None = None
    action: str | None = None
    actor: str | None = None
    reason: str | None = None
    input: dict[str, Any] | None = None
    why: str | None = None
    at: float | None = None


STREAM_KINDS: frozenset[str] = frozenset({"delta", "discarded"})
"""Entries of a streaming run (RunSpec.stream) that are not committed events: no `seq`, not journaled
(workers/process/deltas.py, docs/streaming.md)."""


class RunEventRecord(BaseModel):
    """One event of a run, as stored in its stream: `id` (the stream id, to resume reading after),
    `seq` (1, 2, ... per run), `segment`, `kind`, and the event's own fields flat beside them
    (a `model` event has `step`, `text`, `tool_calls`, `cost_usd`, `usage`; see SPEC 2.11).
    A streaming run's `delta` (`step`, `attempt`, `text`) and `discarded` (`step`, `attempt`)
    entries have `seq` None: they are the live view of a model call, not committed events."""

    model_config = ConfigDict(frozen=True, extra="allow")

    id: str
    seq: int | None
    segment: int
    kind: str

    @property
    def committed(self) -> bool:
        """True for a committed event; False for a `delta` or `discarded` entry."""
        return self.seq is not None

    @property
    def data(self) -> dict[str, Any]:
        """The event's own fields (everything but id, seq, segment)."""
        return {"kind": self.kind, **(self.model_extra or {})}
