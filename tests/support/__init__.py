"""Helpers shared by the integration and fault suites."""
