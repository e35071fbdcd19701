"""tests/support/timers.py writes the workers' delivery timers out for the tests that run with the
defaults (test_commit_wait.py, the Sentinel drill): they are the defaults Settings reads, or those
tests would run with something else than a deployment that sets none."""

from __future__ import annotations

import pytest

from tests.support.timers import PRODUCTION_TIMERS
from workers.config.settings import Settings


def test_the_written_out_timers_are_the_settings_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in PRODUCTION_TIMERS:
        monkeypatch.delenv(name, raising=False)
    defaults = Settings.from_env()
    assert {
        "TOOLLOOP_VISIBILITY_TIMEOUT": defaults.visibility_timeout,
        "TOOLLOOP_RESTORE_INTERVAL": defaults.restore_interval,
        "TOOLLOOP_LEASE_MS": defaults.lease_ms,
        "TOOLLOOP_REDRIVE_AGE": defaults.redrive_age,
        "TOOLLOOP_OUTBOX_AGE": defaults.outbox_age,
        "TOOLLOOP_SWEEP_INTERVAL": defaults.sweep_interval,
    } == {name: float(value) for name, value in PRODUCTION_TIMERS.items()}
