"""How a step begins: RUN_BEGIN (the run's lease, the delivery count, and what of the run a kept loop
lacks), or what the predecessor's commit began for it (RUN_COMMIT's go_on). Either way the step gets
one frozen value, `BegunStep`, or the `Refused` reply that says why it does not run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from workers.process.live import Begun, LiveLoop
from workers.process.worker_process import WorkerProcess
from workers.protocol import keys, names
from workers.protocol.scripts.begin import (
    RUN_BEGIN,
    Loaded,
    Refused,
    Started,
    parse_begin,
)


@dataclass(frozen=True)
class BegunStep:
    """Step `n` of run `run_id` holds the run's lease `<owner>:<token>`: what it began with.

    `delivered`: this task's deliveries so far; `state`: the run's state hash as the step began (the
    step reads it, never writes it); `outside`: spend recorded outside the loop; `loaded`: the run's
    spec, journal and input when the step has no current loop of the run (None when `kept` is one);
    `kept`: the run's loop this process kept paused where this step goes on, else None; `sent_at`: when
    the script that took the lease was sent (time.monotonic())."""

    run_id: str
    n: int
    owner: str
    token: int
    delivered: int
    state: dict[str, str]
    outside: float
    sent_at: float
    loaded: Loaded | None
    kept: LiveLoop | None

    @property
    def lease(self) -> str:
        return f"{self.owner}:{self.token}"

    @property
    def segment(self) -> int:
        return int(self.state.get("segment", 0))

    @property
    def prefix(self) -> str:
        """The journal fields' prefix of the step's segment (`s0/`)."""
        return f"{keys.segment_name(self.segment)}/"

    @property
    def steps_base(self) -> int:
        """Model steps of the run's earlier segments."""
        return int(self.state.get("steps_base", 0))

    @property
    def queue(self) -> str:
        """The queue this step's task came from (as the run's state records it)."""
        return self.state.get("queue") or names.LLM


async def begin(
    process: WorkerProcess, run_id: str, n: int, begun: Begun | None
) -> BegunStep | Refused:
    """Begin step `n`: take the run's lease with RUN_BEGIN, or use what the predecessor's commit began
    (`begun`). A loop this process kept for the run goes on only if RUN_BEGIN found it current (it
    loaded nothing); otherwise it is closed here."""
    started: Started | Refused
    kept: LiveLoop | None
    if begun is not None:
        started, kept, owner, sent_at = (
            begun.started,
            begun.loop,
            begun.owner,
            begun.sent_at,
        )
    else:
        owner = process.new_owner()
        kept = process.kept.take(run_id)
        sent_at = time.monotonic()
        started = parse_begin(
            await process.batch.script(
                RUN_BEGIN,
                [
                    keys.state(run_id),
                    keys.spec(run_id),
                    keys.lease(run_id),
                    keys.fence(run_id),
                    keys.attempts(run_id),
                    keys.spend(run_id),
                    keys.inputs(run_id),
                    keys.answers(run_id),
                    keys.outbox(run_id),
                ],
                [
                    owner,
                    process.settings.lease_ms,
                    n,
                    time.time(),
                    keys.journal(run_id, ""),
                    kept.tag if kept else "",
                ],
            )
        )
    # a kept loop is not where the run is when RUN_BEGIN loaded the run (it moved on elsewhere)
    if kept is not None and (
        isinstance(started, Refused) or started.loaded is not None
    ):
        kept.close()
        kept = None
    if isinstance(started, Refused):
        return started
    return BegunStep(
        run_id=run_id,
        n=n,
        owner=owner,
        token=started.token,
        delivered=started.attempts,
        state=started.state,
        outside=started.outside,
        sent_at=sent_at,
        loaded=started.loaded,
        kept=kept,
    )
