"""Journals: where the engine's records become durable.

``LmdbJournal`` is the real one; ``MemoryJournal`` has the same interface and keeps
everything in lists (embedding without disk, the simulator, unit tests).
"""

from zq.journal.base import Journal, RecoveryInput
from zq.journal.lmdb_journal import LmdbJournal
from zq.journal.memory_journal import MemoryJournal

__all__ = ["Journal", "LmdbJournal", "MemoryJournal", "RecoveryInput"]
