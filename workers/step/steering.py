"""The steers a durable run's loop takes (`RunToolLoopOptions.steers`, SPEC 6.1).

A steer sent to a running run waits in the run's state hash (`steer:<id>`, workers/protocol/scripts/talk.py),
which every task reads as it begins (RUN_BEGIN, or the predecessor's commit when it goes on in the
same process): so asking costs no round trip. At the boundary before model turn `turn`:

- the segment's journal holds steps `steer:<id>` taken before that turn: a replay, they come back
  in the order they were taken, and nothing else is taken there once `model:<turn>` is journaled
  (a replay decides as the first run did);
- else the steers waiting in the state of the task that makes that model call (the boundary is
  reached first: the step before commits, and the next task's state is read) that the journal has
  no step for; before a `done` stop (`ending`), those of the task running now, and RUN_COMMIT holds
  the stop for any steer that came since.

Each one the loop takes is its own journal step, `steer:<id>`, run as the step of one task (it is
the first step that is not stored: the boundary before it commits the step before, the boundary
after it commits it). Its commit deletes it from the state (RUN_COMMIT), so it is taken once: a task
killed before that commit leaves it waiting and the step runs again; after it, the journal holds it.
A `done` stop is refused by RUN_COMMIT while a steer waits (the run goes on, takes it, and answers).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from toolloop.journal.redis import decode_entry
from toolloop.loop.types import Steer
from workers.process.live import LiveLoop

PREFIX = "steer:"
SENT = "steer_seq"
"""The state field counting the steers sent to the run (workers/protocol/scripts/talk.py): absent, none was,
so no journal step of the run is a steer and nothing waits (a run never steered looks no further)."""


class _Step(Protocol):
    live: LiveLoop | None

    @property
    def state(self) -> dict[str, str]: ...

    @property
    def segment(self) -> int: ...


def talk_attributes(step: _Step) -> dict[str, Any]:
    """The segment span's attributes of a conversation (workers/observe/tracing.py): `toolloop.follow_up`
    when a follow-up began the segment (workers/client/talk.py), `toolloop.steers` the steers it took."""
    live = step.live
    if live is None or not hasattr(live, "journal"):
        return {}
    steers = sum(1 for key in live.journal.entries if key.startswith(PREFIX))
    found: dict[str, Any] = {"toolloop.steers": steers} if steers else {}
    if step.state.get("follow_up_segment") == str(step.segment):
        found["toolloop.follow_up"] = True
    return found


class Steering:
    """`steers` of one run's loop: reads the loop's journal and the state of the task running it."""

    def __init__(self, live: LiveLoop) -> None:
        self.live = live

    async def __call__(self, turn: int, ending: bool) -> list[Steer]:
        journal = self.live.journal
        entries = journal.entries
        if (
            SENT not in self.live.step.state
        ):  # no steer was ever sent to the run as of this task
            if ending or f"model:{turn}" in entries:
                return []
            # (free: the model step would reach it anyway)
            await journal.boundary(f"model:{turn}")
            if SENT not in self.live.step.state:
                return []
        stored: list[tuple[int, str, str]] = []
        for key, text in entries.items():
            if key.startswith(PREFIX):
                value: Any = decode_entry(text)[1]
                if int(value.get("turn", 0)) == turn:
                    stored.append(
                        (
                            int(value.get("index", 0)),
                            key.removeprefix(PREFIX),
                            str(value["content"]),
                        )
                    )
        if (
            f"model:{turn}" in entries
        ):  # a replay past this boundary: what was taken there, no more
            return [
                Steer(id=steer_id, content=content)
                for _, steer_id, content in sorted(stored)
            ]
        if (
            not ending
        ):  # the state read next is the one of the task that makes the model call
            await journal.boundary(f"model:{turn}")
        waiting: list[tuple[int, str, str]] = []
        for field, raw in self.live.step.state.items():
            if field.startswith(PREFIX) and field not in entries:
                sent = json.loads(raw)
                waiting.append(
                    (
                        int(sent.get("seq", 0)),
                        field.removeprefix(PREFIX),
                        str(sent["content"]),
                    )
                )
        taken = [(steer_id, content) for _, steer_id, content in sorted(stored)]
        taken += [(steer_id, content) for _, steer_id, content in sorted(waiting)]
        return [Steer(id=steer_id, content=content) for steer_id, content in taken]
