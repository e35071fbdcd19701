"""Fixtures of the unit suite: the in-process step harness (tests/support/harness.py)."""

from tests.support.harness import harness_redis, step_harness

__all__ = ["harness_redis", "step_harness"]
