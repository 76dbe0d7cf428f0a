"""An in-memory journal with the LMDB journal's interface and crash semantics.

``append`` stages records; ``commit`` makes them "durable". ``crash()`` drops what
was staged but not committed, as a killed process would; the simulator uses it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator

from zq.core import records as R
from zq.journal.base import declared_name, resolve_copy


class MemoryJournal:
    def __init__(self) -> None:
        self.messages: list[R.Message] = []
        self.message_seqs: list[int] = []
        self.events: list[R.Event] = []
        self.event_seqs: list[int] = []
        self.queues: dict[str, R.QueueDeclared] = {}
        self.rps: dict[str, int] = {}
        self.staged: list[object] = []
        self.by_seq: dict[int, R.Message] = {}
        self.ids: dict[tuple[str, str], tuple[int, int]] = {}

    def append(self, records: Iterable[object]) -> None:
        self.staged.extend(records)

    def commit(self, now_ms: int = 0, *, urgent: bool = True) -> None:
        staged, self.staged = self.staged, []
        for rec in staged:
            if isinstance(rec, R.Message):
                if rec.msg_id is not None and rec.copy_of is None:
                    self.ids.setdefault((rec.topic, rec.msg_id), (rec.seq, rec.ts_ms))
                if rec.copy_of is not None:
                    rec = resolve_copy(rec, self.by_seq.get(rec.copy_of))
                assert not self.message_seqs or rec.seq > self.message_seqs[-1]
                self.messages.append(rec)
                self.message_seqs.append(rec.seq)
                self.by_seq[rec.seq] = rec
            elif isinstance(rec, R.Event):
                self.events.append(rec)
                self.event_seqs.append(rec.seq)
            elif isinstance(rec, R.QueueDeclared):
                self.queues[declared_name(rec)] = rec
            elif isinstance(rec, R.QueueDeleted):
                self.queues.pop(rec.queue, None)
            elif isinstance(rec, R.RecoveryPoint):
                self.rps[rec.queue] = rec.seq
            else:
                raise AssertionError(f"unknown record {rec!r}")

    def crash(self) -> None:
        self.staged = []

    def declared(self) -> list[R.QueueDeclared]:
        return list(self.queues.values())

    def recovery_points(self) -> dict[str, int]:
        return dict(self.rps)

    def next_seq(self) -> int:
        last = max(self.message_seqs[-1] if self.message_seqs else 0, self.event_seqs[-1] if self.event_seqs else 0)
        return last + 1

    def read_messages(self, from_seq: int) -> Iterator[R.Message]:
        return iter(self.messages[bisect_left(self.message_seqs, from_seq):])

    def read_events(self, from_seq: int) -> Iterator[R.Event]:
        return iter(self.events[bisect_left(self.event_seqs, from_seq):])

    def get_message(self, seq: int) -> R.Message | None:
        """The engine's content port: a committed message, dead letters resolved."""
        return self.by_seq.get(seq)

    def messages_from(self, from_seq: int, limit: int) -> list[R.Message]:
        """The engine's scan port: up to ``limit`` committed messages from ``from_seq`` on."""
        i = bisect_left(self.message_seqs, from_seq)
        return self.messages[i : i + limit]

    def read_raw(self, from_seq: int, max_records: int, max_bytes: int = 0) -> list[tuple[int, bytes]]:
        i = bisect_left(self.message_seqs, from_seq)
        out: list[tuple[int, bytes]] = []
        size = 0
        for m in self.messages[i : i + max_records]:
            raw = R.record_encoder.encode(m)
            out.append((m.seq, raw))
            size += len(raw)
            if max_bytes and size >= max_bytes:
                break
        return out

    def seq_at_time(self, ts_ms: int) -> int:
        for m in self.messages:
            if m.ts_ms >= ts_ms:
                return m.seq
        return self.next_seq()

    def find_id(self, topic: str, msg_id: str) -> tuple[int, int] | None:
        """The dedup port: the first journaled publish of ``msg_id`` on ``topic``."""
        return self.ids.get((topic, msg_id))

    def get_messages(self, seqs: list[int]) -> list[R.Message]:
        return [self.by_seq[s] for s in seqs]

    def get_raw(self, seqs: list[int]) -> list:
        import msgspec

        return [msgspec.Raw(R.record_encoder.encode(self.by_seq[s])) for s in seqs]

    def close(self) -> None:
        pass
