"""Every name the workers share: task names, queues, task ids, outbox members, key prefixes.

A leaf: it imports nothing from `workers/`, and every other module takes its names from here. The
library's keys (a run's hash-tagged keys, the live index, the cancel channel) stay in
`workers/protocol/keys.py`; kombu's Redis layout comes from kombu itself.
"""

from __future__ import annotations

from kombu.transport.redis import PRIORITY_STEPS as KOMBU_PRIORITY_STEPS
from kombu.transport.redis import Channel as _KombuChannel

# -- task names and queues -------------------------------------------------------------------------

ADVANCE = "toolloop.advance"
ANSWER = "toolloop.answer"
CANCEL = "toolloop.cancel"
SWEEP = "toolloop.sweep"
DECIDE = "toolloop.decide"

LLM = "llm"
TOOLS = "tools"
CONTROL = "control"
QUEUES = (LLM, TOOLS, CONTROL)
"""The queues of `workers.app`; a worker gives them to its step consumer unless told otherwise."""
STEP_QUEUES = QUEUES

# -- task ids (readable: a step's id says its run and number) ---------------------------------------


def step_id(run_id: str, n: int | str) -> str:
    """The id of task `n` of a run (`<run id>:<n>`): a copy of the same step has the same id."""
    return f"{run_id}:{n}"


def answer_task_id(run_id: str, answer_id: str) -> str:
    return f"{run_id}:answer:{answer_id}"


def decide_task_id(run_id: str, decision_id: str) -> str:
    return f"{run_id}:decide:{decision_id}"


def cancel_task_id(run_id: str) -> str:
    return f"{run_id}:cancel"


def step_run(task_id: str) -> str | None:
    """The run id of a `toolloop.advance` task id (`<32 hex>:<n>`), else None."""
    run, _, n = task_id.partition(":")
    return (
        run
        if n.isdigit() and len(run) == 32 and all(c in "0123456789abcdef" for c in run)
        else None
    )


# -- outbox members ----------------------------------------------------------------------------------


def member(n: int | str, queue: str) -> str:
    """A run's outbox member for task `n` on `queue` (`<n>|<queue>`)."""
    return f"{n}|{queue}"


def parse_member(text: str) -> tuple[int, str]:
    """(n, queue) of an outbox member."""
    n, _, queue = text.partition("|")
    return int(n), queue


SENT_AT = "sent_at"
"""The task message header with the time it was sent (Unix seconds), which Celery's own messages lack:
the age of the oldest waiting step (workers/observe/queueage.py) is read from it."""

PROCESS_ATTR = "toolloop_process"
"""The attribute of a worker's Celery app that holds its `WorkerProcess`
(workers/process/worker_process.py)."""

# -- kombu's Redis layout (read from kombu, never restated) ------------------------------------------

UNACKED = str(_KombuChannel.unacked_key)
UNACKED_INDEX = str(_KombuChannel.unacked_index_key)
PRIORITY_SEP = str(_KombuChannel.sep)
PRIORITY_STEPS = tuple(int(step) for step in KOMBU_PRIORITY_STEPS)


def queue_of(list_key: str) -> str:
    """The queue of one of its priority lists' keys."""
    return list_key.split(PRIORITY_SEP)[0]
