"""`AbortController.abort_at`: a signal that reads as aborted from a monotonic deadline on (the bound a
durable worker puts on a step's work: its lease's deadline, docs/workers.md "Leases")."""

from __future__ import annotations

import asyncio
import time

import pytest

from toolloop import AbortController, AbortError


def test_a_deadline_in_the_past_aborts_with_its_reason_when_the_signal_is_read() -> (
    None
):
    controller = AbortController()
    called: list[str] = []
    controller.signal.add_callback(lambda: called.append("aborted"))
    controller.abort_at(time.monotonic() - 0.001, "the lease lapsed")
    assert called == []  # no timer: nothing happens until someone looks
    assert controller.signal.aborted
    assert controller.signal.reason == "the lease lapsed"
    assert called == ["aborted"]
    with pytest.raises(AbortError, match="the lease lapsed"):
        controller.signal.throw_if_aborted()


def test_a_deadline_ahead_does_not_abort_and_can_be_moved_or_taken_away() -> None:
    controller = AbortController()
    controller.abort_at(time.monotonic() + 60, "late")
    assert not controller.signal.aborted
    controller.abort_at(time.monotonic() + 0.05, "late")
    controller.abort_at(None)
    time.sleep(0.06)
    assert not controller.signal.aborted
    controller.abort_at(time.monotonic() + 0.02, "late")
    time.sleep(0.03)
    assert controller.signal.aborted
    controller.abort_at(None)  # an aborted signal stays aborted
    assert controller.signal.aborted and controller.signal.reason == "late"


async def test_a_waiter_wakes_once_a_passed_deadline_is_read() -> None:
    controller = AbortController()
    waiting = asyncio.ensure_future(controller.signal.wait())
    controller.abort_at(time.monotonic() - 1, "gone")
    await asyncio.sleep(0)
    assert not waiting.done()
    assert controller.signal.aborted  # the worker's lease loop reads it each round
    await asyncio.wait_for(waiting, 1)
