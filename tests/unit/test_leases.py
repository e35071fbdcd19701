"""`workers.process.leases.Leases`: the local deadline of a step's lease, what aborts the step's signal, and
a lapsed lease taken again.

The batch here answers each LEASE_KEEP as the test says (no Redis): 1 (renewed), 2 (it had lapsed
and was taken again), 0 (another copy holds it), -1 (it lapsed and another copy began the step
since), an error, or an answer that comes back late. The script itself, against a real Redis:
tests/integration/test_lease_keep.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from toolloop import AbortController, AbortError
from workers.process.leases import Leases
from workers.protocol.errors import LeaseLostError

LEASE_MS = 300


class Batch:
    """Answers every LEASE_KEEP with `reply` after `delay` s (the next of `reply` when a list); counts
    them."""

    def __init__(self, reply: Any = 1, delay: float = 0.0) -> None:
        self.reply = reply
        self.delay = delay
        self.renewals = 0

    def script(
        self, source: str, keys: list[str], args: list[Any]
    ) -> asyncio.Future[Any]:
        self.renewals += 1
        return asyncio.ensure_future(self._answer())

    async def _answer(self) -> Any:
        await asyncio.sleep(self.delay)
        reply = self.reply.pop(0) if isinstance(self.reply, list) else self.reply
        if isinstance(reply, BaseException):
            raise reply
        return reply


def _leases(batch: Batch) -> Leases:
    return Leases(batch, LEASE_MS)  # type: ignore[arg-type]


async def test_work_begins_without_a_round_trip_while_the_deadline_is_far() -> None:
    batch = Batch()
    leases = _leases(batch)
    lost: list[LeaseLostError] = []
    held = leases.hold("r", 1, "me:1", time.monotonic(), lost.append)
    controller = AbortController()
    assert leases.begin_work(held, controller) is None
    assert batch.renewals == 0 and not controller.signal.aborted
    await asyncio.sleep(LEASE_MS / 1000 * 2)  # renewals (every 100 ms) keep it alive
    assert batch.renewals >= 3 and not controller.signal.aborted and not lost
    leases.end_work(held)
    leases.drop(held)


async def test_a_renewal_answered_0_aborts_the_working_step_at_once() -> None:
    batch = Batch(reply=0)
    leases = _leases(batch)
    lost: list[LeaseLostError] = []
    held = leases.hold("r", 1, "me:1", time.monotonic(), lost.append)
    controller = AbortController()
    leases.begin_work(held, controller)
    await asyncio.sleep(LEASE_MS / 1000 / 3 + 0.05)  # the first renewal round
    assert len(lost) == 1 and "another copy of the step holds it" in str(lost[0])
    assert held.lost and not held.holds
    leases.drop(held)


async def test_failed_renewals_let_the_deadline_pass_and_the_signal_aborts_there() -> (
    None
):
    batch = Batch(reply=ConnectionError("Redis went away"))
    leases = _leases(batch)
    held = leases.hold("r", 1, "me:1", time.monotonic(), lambda error: None)
    controller = AbortController()
    leases.begin_work(held, controller)
    await asyncio.sleep(LEASE_MS / 1000 * 0.8)
    assert not controller.signal.aborted
    await asyncio.sleep(LEASE_MS / 1000 * 0.2)  # past 90 % of the lease since the take
    assert controller.signal.aborted and isinstance(
        controller.signal.reason, LeaseLostError
    )
    with pytest.raises(AbortError, match="deadline"):
        controller.signal.throw_if_aborted()
    leases.drop(held)


async def test_a_renewal_that_comes_back_after_its_own_deadline_does_not_extend_the_lease() -> (
    None
):
    batch = Batch(reply=1, delay=LEASE_MS / 1000)  # Redis stalled: the answer is late
    leases = _leases(batch)
    held = leases.hold("r", 1, "me:1", time.monotonic(), lambda error: None)
    controller = AbortController()
    leases.begin_work(held, controller)
    await asyncio.sleep(LEASE_MS / 1000 * 1.5)
    # its deadline passed: nothing begins now
    assert not held.holds and controller.signal.aborted
    leases.drop(held)


async def test_a_lease_that_lapsed_under_running_work_and_is_taken_again_keeps_the_work() -> (
    None
):
    batch = Batch(reply=[2, 1, 1, 1, 1, 1, 1, 1])
    leases = _leases(batch)
    lost: list[LeaseLostError] = []
    # the process was paused past its lease
    taken = time.monotonic() - LEASE_MS / 1000 * 2
    held = leases.hold("r", 1, "me:1", taken, lost.append)
    controller = AbortController()
    held.working, held.controller = True, controller  # its work began before the pause
    controller.abort_at(held.deadline, "the old deadline")
    await asyncio.sleep(LEASE_MS / 1000 / 3 + 0.05)  # the first round: taken again
    assert not lost and held.holds and not controller.signal.aborted
    leases.drop(held)


async def test_a_lease_that_lapsed_and_the_run_moved_on_stops_the_work() -> None:
    batch = Batch(reply=-1)
    leases = _leases(batch)
    lost: list[LeaseLostError] = []
    held = leases.hold(
        "r", 1, "me:1", time.monotonic() - LEASE_MS / 1000 * 2, lost.append
    )
    held.working, held.controller = True, AbortController()
    await asyncio.sleep(LEASE_MS / 1000 / 3 + 0.05)
    assert (
        len(lost) == 1
        and "another copy began the step since" in str(lost[0])
        and held.lost
    )
    leases.drop(held)


async def test_past_its_deadline_a_step_begins_work_only_once_redis_gave_the_lease_back() -> (
    None
):
    batch = Batch(reply=2)
    leases = _leases(batch)
    held = leases.hold(
        "r", 1, "me:1", time.monotonic() - LEASE_MS / 1000 * 2, lambda error: None
    )
    controller = AbortController()
    checking = leases.begin_work(held, controller)
    assert checking is not None  # a fence read first
    await checking
    assert not controller.signal.aborted and held.holds
    leases.drop(held)


async def test_near_its_deadline_a_step_renews_before_its_work_and_stops_when_redis_says_0() -> (
    None
):
    batch = Batch(reply=0)
    leases = _leases(batch)
    lost: list[LeaseLostError] = []
    # a renewal is late: less than half is left
    taken = time.monotonic() - LEASE_MS / 1000 * 0.6
    held = leases.hold("r", 1, "me:1", taken, lost.append)
    controller = AbortController()
    checking = leases.begin_work(held, controller)
    assert checking is not None
    await checking
    assert len(lost) == 1 and held.lost
    leases.drop(held)


async def test_a_step_between_its_work_and_its_commit_is_not_aborted() -> None:
    batch = Batch(reply=0)
    leases = _leases(batch)
    lost: list[LeaseLostError] = []
    held = leases.hold("r", 1, "me:1", time.monotonic(), lost.append)
    controller = AbortController()
    leases.begin_work(held, controller)
    leases.end_work(held)  # the work returned: the commit's fence decides now
    await asyncio.sleep(LEASE_MS / 1000 * 1.2)
    assert held.lost and not lost and not controller.signal.aborted
    leases.drop(held)
