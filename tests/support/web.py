"""The bearer token the tests give examples/web.py (TOOLLOOP_WEB_TOKEN) and the header that sends it."""

from __future__ import annotations

WEB_TOKEN = "test-web-token-7f3a"
AUTH = {"Authorization": f"Bearer {WEB_TOKEN}"}
