"""Journals: where each step's value is stored once and replayed."""

from toolloop.journal.base import Journal, idempotency_key
from toolloop.journal.memory import MemoryJournal
from toolloop.journal.redis import RedisJournal

__all__ = ["Journal", "MemoryJournal", "RedisJournal", "idempotency_key"]
