"""The leases of the steps a process runs (`Leases`): renewed together, each with a local deadline,
and taken again after a pause when nobody began the step meanwhile.

Invariant: a step's work (a model call, a tool's `run` or `start`) begins only while its lease is
certainly the step's: before the lease's local deadline (the send time of the last renewal Redis
confirmed, on the monotonic clock, plus 90 % of the lease: Redis ran that renewal after it was sent,
so its expiry is later still). `begin_work` needs no Redis round trip while the deadline is far; when
it is near or past, the step asks Redis first (a fence read) and begins only on its answer. The
step's abort signal fires at the deadline (`AbortController.abort_at`), so whatever looks at it past
the deadline (the provider right before it sends, a tool before its effect) sees it aborted.

Each renewal is LEASE_KEEP (workers/protocol/scripts/lease.py), one atomic script: it renews the lease, or,
when the lease lapsed (the process was frozen, or Redis did not answer in time, for longer than the
lease), takes it again, but only when no other copy began the step since (the run's fence is still
the step's token, its commit not made). So a process paused past its lease with nobody to take the
step over goes on when it resumes: the work in flight (a model call already paid for) is kept, and
its deadline is set from the answer. An answer that another copy holds the lease, or took it and
moved the run on, aborts the step at once: its work stops and nothing of it is committed (the commit
is fenced by the token as well). A renewal that fails (Redis unreachable) lets the deadline pass;
past it, a failed one aborts the step. See docs/workers.md, "Leases".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis as redis_lib

from toolloop.abort import AbortController
from workers.process.redisio import Batch
from workers.protocol import keys
from workers.protocol.errors import LeaseLostError
from workers.protocol.scripts.lease import LEASE_KEEP, parse_keep

log = logging.getLogger("toolloop.workers")

_SAFE = 0.9
"""The share of the lease a confirmed renewal is trusted for, counted from the renewal's send time."""
_NEAR = 0.5
"""A step whose deadline is closer than this share of the lease renews before its work begins."""


class Held:
    """One lease this process holds: its run's keys (lease, fence, state) and value, the commit `n`
    its step makes, the deadline of its last confirmed renewal (monotonic), and the step's
    `on_lost(error)`. `working`: the step's work runs (its signal has the deadline); `lost`: the
    lease is known gone; `elsewhere`: gone to another copy of the step (it holds the lease, or began
    the step since: the step's commit would be fenced), not merely past its deadline unconfirmed."""

    __slots__ = (
        "controller",
        "deadline",
        "elsewhere",
        "key",
        "keys",
        "lost",
        "n",
        "on_lost",
        "value",
        "working",
    )

    def __init__(
        self,
        run_id: str,
        n: int,
        value: str,
        deadline: float,
        on_lost: Callable[[LeaseLostError], None],
    ) -> None:
        self.key = keys.lease(run_id)
        self.keys = [self.key, keys.fence(run_id), keys.state(run_id)]
        self.n = n
        self.value = value
        self.deadline = deadline
        self.on_lost = on_lost
        self.controller: AbortController | None = None
        self.working = False
        self.lost = False
        self.elsewhere = False

    @property
    def holds(self) -> bool:
        """True while the lease is certainly ours: not lost, and its deadline not reached."""
        return not self.lost and time.monotonic() < self.deadline


def _no_step(error: LeaseLostError) -> None:
    """`Held.on_lost` once the step is over: nothing runs that the loss could stop."""


class Leases:
    """The leases this process holds (lease key -> `Held`), renewed together every third of the lease
    time, in one batch: no thread or task per step waits to renew its own."""

    def __init__(self, batch: Batch, lease_ms: int) -> None:
        self.batch = batch
        self.lease_ms = lease_ms
        self.trusted_s = lease_ms / 1000 * _SAFE
        self.held: dict[str, Held] = {}
        self.taken = 0
        """How many leases this process has held so far (the idle trimmer reads it,
        workers/worker/trim.py)."""
        self.task: asyncio.Task[None] | None = None

    def hold(
        self,
        run_id: str,
        n: int,
        value: str,
        sent_at: float,
        on_lost: Callable[[LeaseLostError], None],
    ) -> Held:
        """Hold `value` at the run's lease for the step making commit `n`, taken by a script sent at
        `sent_at` (time.monotonic())."""
        held = Held(run_id, n, value, sent_at + self.trusted_s, on_lost)
        self.held[held.key] = held
        self.taken += 1
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._renew_forever())
        return held

    def drop(self, held: Held) -> None:
        """The step is over (or frees its lease): its lease is no longer renewed nor taken again, and
        `held` lets go of the step's `on_lost` and controller (a bound method back to the step: no
        cycle is left)."""
        self.end_work(held)
        if self.held.get(held.key) is held:
            del self.held[held.key]
        held.on_lost = _no_step
        held.controller = None

    def begin_work(
        self, held: Held, controller: AbortController
    ) -> Awaitable[None] | None:
        """Just before a step's work (a model call, a tool's run or start) begins: the step's signal
        aborts at the lease's deadline from now on (at once when it passed, unless the returned
        awaitable confirms the lease first), and when the deadline is near or past, the returned
        awaitable asks Redis first (a fence read: renewed, or taken again when it lapsed and nobody
        began the step since; the work begins only on that answer)."""
        held.working = True
        held.controller = controller
        if held.lost:
            controller.abort(
                LeaseLostError(
                    f"the lease {held.key!r} was lost before the step's work began"
                )
            )
            return None
        controller.abort_at(held.deadline, self._expired(held))
        if held.deadline - time.monotonic() < self.lease_ms / 1000 * _NEAR:
            return self.confirm(held)
        return None

    def end_work(self, held: Held) -> None:
        """The step's work returned or raised: its signal keeps no deadline (the commit is fenced)."""
        if held.working:
            held.working = False
            if held.controller is not None:
                held.controller.abort_at(None)

    async def confirm(self, held: Held) -> None:
        """Keep `held` now and wait for the answer (a failed call leaves the deadline as it is)."""
        sent = time.monotonic()
        try:
            reply = await self._keep(held)
        except (OSError, redis_lib.RedisError) as error:
            log.warning(
                "lease %s: renewing before the step's work failed (%s)", held.key, error
            )
            return
        self._kept(held, reply, sent)

    def _keep(self, held: Held) -> asyncio.Future[Any]:
        return self.batch.script(
            LEASE_KEEP, held.keys, [held.value, self.lease_ms, held.n]
        )

    def _kept(self, held: Held, reply: Any, sent: float) -> None:
        """LEASE_KEEP's answer to a call sent at `sent`."""
        if self.held.get(held.key) is not held or held.lost:
            return
        kept = parse_keep(reply)
        if kept in ("held elsewhere", "moved on"):
            held.elsewhere = True
        if kept == "held elsewhere":
            self._lose(held, "another copy of the step holds it")
        elif kept == "moved on":
            self._lose(
                held,
                "it lapsed, and another copy began the step since (or the step's commit is made)",
            )
        else:
            deadline = sent + self.trusted_s
            if kept == "taken again":
                log.warning(
                    "lease %s had lapsed (the process was paused, or Redis did not answer in time) and "
                    "nobody began the step since: taken again; the step's work goes on",
                    held.key,
                )
            if deadline <= held.deadline or deadline <= time.monotonic():
                return  # an older answer, or one too late to trust: the next round asks again
            held.deadline = deadline
            if held.working and held.controller is not None:
                held.controller.abort_at(deadline, self._expired(held))

    def _expired(self, held: Held) -> LeaseLostError:
        return LeaseLostError(
            f"the lease {held.key!r} reached its deadline without a confirmed renewal "
            "(the process was frozen, or Redis did not answer in time)"
        )

    def _lose(self, held: Held, why: str) -> None:
        held.lost = True
        if held.working:
            log.warning(
                "lease %s lost: %s; the step stops and its work is not committed",
                held.key,
                why,
            )
            held.on_lost(LeaseLostError(f"the lease {held.key!r} was lost: {why}"))

    async def _renew_forever(self) -> None:
        """Keep every held lease each third of the lease time; after a failed round (a cut
        connection), try again within 0.2 s rather than a third of the lease later, so that two cuts
        in a row do not let a lease lapse under a step that still runs; after a round answered too
        late to trust (a pause while it was on its way), at once. A round is a call of its own,
        so nothing of it (the leases, their steps) stays alive through the sleep."""
        interval = max(0.05, self.lease_ms / 3000)
        wait = interval
        while True:
            await asyncio.sleep(wait)
            failed = await self._renew_round()
            now = time.monotonic()
            if any(
                not lease.lost and now >= lease.deadline for lease in self.held.values()
            ):
                wait = 0.0  # answered too late to trust (the process was paused meanwhile): ask again now
            else:
                wait = min(0.2, interval) if failed else interval

    async def _renew_round(self) -> bool:
        """Keep every held lease once (one past its deadline too: Redis says whether it can be taken
        again); True when a renewal failed. A lease whose renewal failed past its deadline is lost."""
        sent = time.monotonic()
        held = [lease for lease in self.held.values() if not lease.lost]
        replies = await asyncio.gather(
            *(self._keep(lease) for lease in held), return_exceptions=True
        )
        failed = [reply for reply in replies if isinstance(reply, BaseException)]
        now = time.monotonic()
        for lease, reply in zip(held, replies, strict=True):
            if not isinstance(reply, BaseException):
                self._kept(lease, reply, sent)
            elif (
                now >= lease.deadline
                and self.held.get(lease.key) is lease
                and not lease.lost
            ):
                self._lose(lease, "its deadline passed without a confirmed renewal")
        if failed:
            log.warning(
                "lease renewal failed for %d of %d steps (%s); retrying",
                len(failed),
                len(held),
                failed[0],
            )
        return bool(failed)
