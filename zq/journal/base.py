"""What every journal offers, and the one recovery routine both journals share."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Protocol

import msgspec

from zq.core import records as R
from zq.core.engine import Engine
from zq.core.records import resolve_copy  # noqa: F401 (journals import it from here)
from zq.core.settings import QueueSettings

log = logging.getLogger("zq.journal")


class RecoveryInput(Protocol):
    def declared(self) -> list[R.QueueDeclared]: ...
    def recovery_points(self) -> dict[str, int]: ...
    def next_seq(self) -> int: ...
    def read_messages(self, from_seq: int) -> Iterator[R.Message]: ...
    def read_events(self, from_seq: int) -> Iterator[R.Event]: ...
    def get_message(self, seq: int) -> R.Message | None: ...
    def find_id(self, topic: str, msg_id: str) -> tuple[int, int] | None: ...
    def messages_from(self, from_seq: int, limit: int) -> list[R.Message]: ...


class Journal(RecoveryInput, Protocol):
    def append(self, records: Iterable[object]) -> None: ...
    def commit(self, now_ms: int) -> None: ...
    def get_messages(self, seqs: list[int]) -> list[R.Message]: ...
    def close(self) -> None: ...


def recover_engine(journal: RecoveryInput, queues: Iterable[QueueSettings], *, auto_queues: bool = True) -> Engine:
    """Rebuild an engine from a journal: read from the lowest recovery point up."""
    queues = list(queues)
    declared = journal.declared()
    rps = journal.recovery_points()
    names = {q.name for q in queues}
    configured = set(names)
    for d in declared:
        name = declared_name(d)
        if name in configured:
            log.warning("queue %r was declared at run time and is also in the config: the config wins", name)
        names.add(name)
    starts = [rps.get(name, 0) for name in names]
    # A queue with no recovery point yet has to be read from the start.
    start = min(starts, default=journal.next_seq())
    return Engine.recover(
        queues,
        declared,
        rps,
        journal.next_seq(),
        journal.read_events(start),
        journal.read_messages(start),
        auto_queues=auto_queues,
        content=journal.get_message,
        find_id=journal.find_id,
        scan=journal.messages_from,
    )


def declared_name(d: R.QueueDeclared) -> str:
    return msgspec.json.decode(d.settings_json, type=QueueSettings).name
