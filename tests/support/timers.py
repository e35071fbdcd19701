"""The workers' delivery timers at their defaults (workers/config/settings.py), written out for the
tests that must show nothing waits on them: with these, a step lost at a fault comes back only after
the visibility timeout (an hour) or the sweeper's re-drive (five minutes), so a test that ends within
its seconds shows that no step was lost. Most tests run with small timers instead
(tests/integration/conftest.py FAST_RECOVERY, tests/faults/workerpool.py FAST), which would hide one.
tests/unit/test_default_timers.py keeps them equal to the settings' defaults."""

from __future__ import annotations

PRODUCTION_TIMERS = {
    "TOOLLOOP_VISIBILITY_TIMEOUT": "3600",
    "TOOLLOOP_RESTORE_INTERVAL": "5",
    "TOOLLOOP_LEASE_MS": "120000",
    "TOOLLOOP_REDRIVE_AGE": "300",
    "TOOLLOOP_OUTBOX_AGE": "30",
    "TOOLLOOP_SWEEP_INTERVAL": "15",
}
