"""A standby's copy of a dispatcher's journal, written record for record.

Why bytes, not records
----------------------
A standby keeps its own LMDB journal identical to the leader's, so that `zq serve` on
it recovers exactly what the leader would have: the same bookmarks, the same events,
the same run-time queues and recovery points, the same message-id index. So the
standby stores the records' bytes as the leader stored them (dead letters already
resolved, nothing re-encoded), in bookmark order, and mirrors the two small tables
that are not keyed by bookmark (run-time queue declarations, recovery points) and
what the leader's retention deleted. One write transaction per batch, synced before it
counts: a standby never claims a position its disk does not hold.

The wire carries records unsealed; the standby seals each as it stores it
(``integrity.seal``: the same bytes, the same CRC-32 the leader stored), so its journal
is the leader's byte for byte and checked the same way when read.
"""

from __future__ import annotations

import struct

import msgspec

from zq.core import records as R
from zq.core.errors import JournalError
from zq.journal.base import declared_name
from zq.journal.integrity import seal
from zq.journal.lmdb_journal import NEXT_FLOOR_KEY, LmdbJournal, id_key, key, unkey
from zq.journal.ranges import record_seq

_ID = struct.Struct(">QQ")
EPOCH_PREFIX = b"epoch:"  # meta: epoch:<epoch, 8 bytes> -> the first bookmark its leader wrote
POSITION_KEY = b"replica:next"  # meta: every record below this bookmark is here (or was trimmed by the leader)
TRIM_MAX = 100_000  # records deleted per batch at most (bounded work, as the leader's retention)


def position(journal: LmdbJournal) -> int:
    """Where this standby's copy goes on from (0: nothing copied yet)."""
    with journal.env.begin(db=journal.meta) as txn:
        raw = txn.get(POSITION_KEY)
    return unkey(raw) if raw is not None else 0


def apply(journal: LmdbJournal, messages: list[bytes], events: list[bytes], upto: int,
          declared: list[bytes] | None = None, recovery_points: dict[str, int] | None = None,
          leader_first: int = 0, epochs: list[tuple[int, int]] | None = None) -> None:
    """Store one batch of the leader's records (``messages`` and ``events``: stored
    bytes, in bookmark order, all below ``upto``) and move the position to ``upto``;
    with ``declared`` (encoded ``QueueDeclared`` records), make the run-time queues the
    leader's; with ``recovery_points``, the leader's (never past ``upto``); with
    ``leader_first``, delete what the leader's retention deleted below it; with
    ``epochs``, make the epoch history the leader's. Then sync."""
    try:
        with journal.env.begin(write=True) as txn:
            ids = journal.ids
            for db, rows in ((journal.msgs, messages), (journal.events, events)):
                if not rows:
                    continue
                pairs = [(key(record_seq(raw)), seal(raw)) for raw in rows]
                with txn.cursor(db=db) as cur:
                    _, added = cur.putmulti(pairs, append=True, overwrite=False)
                if added != len(pairs):
                    raise JournalError("a record the leader sent is already in this standby's journal "
                                       "(two standbys writing one directory?)")
                if db is journal.msgs and ids is not None:
                    for raw in rows:
                        m = R.message_decoder.decode(raw)
                        # Copies (dead letters, moves) are stored resolved, with their
                        # original's id: the leader never indexed them; they say zq.reason.
                        # (A redrive copy says nothing, but its original's entry is there first.)
                        if m.msg_id is not None and m.copy_of is None and "zq.reason" not in m.headers:
                            txn.put(id_key(m.topic, m.msg_id), _ID.pack(m.seq, m.ts_ms), db=ids, overwrite=False)
            if declared is not None:
                wanted = {}
                for raw in declared:
                    rec = R.record_decoder.decode(raw)
                    if type(rec) is not R.QueueDeclared:
                        raise JournalError(f"not a queue declaration: {rec!r}")
                    wanted[declared_name(rec).encode()] = raw
                with txn.cursor(db=journal.queues) as cur:
                    stale = [k for k in cur.iternext(values=False) if k not in wanted]
                for k in stale:
                    txn.delete(k, db=journal.queues)
                for k, raw in wanted.items():
                    txn.put(k, seal(raw) if journal.tables_sealed else raw, db=journal.queues)
            if recovery_points is not None:
                for name, seq in recovery_points.items():
                    txn.put(b"rp:" + name.encode(), key(min(seq, upto)), db=journal.meta)
            if leader_first:
                trim_below(journal, txn, leader_first)
            if epochs is not None:
                put_epochs(journal, txn, epochs)
            txn.put(POSITION_KEY, key(upto), db=journal.meta)
            txn.put(NEXT_FLOOR_KEY, key(upto), db=journal.meta)  # promoted, it numbers on from here
        journal.env.sync(True)
        journal.synced(upto)  # the directory's mark follows (at most every few seconds)
    except msgspec.DecodeError as exc:
        raise JournalError(f"the leader sent a record this standby cannot read: {exc}") from None
    finally:
        journal.release_reader()


def trim_below(journal: LmdbJournal, txn, below: int) -> int:  # type: ignore[no-untyped-def]
    """Delete records below ``below`` (the leader's retention deleted them)."""
    deleted = 0
    stop = key(below)
    for db in (journal.msgs, journal.events):
        with txn.cursor(db=db) as cur:
            while deleted < TRIM_MAX and cur.first() and cur.key() < stop:
                if db is journal.msgs:
                    journal.drop_id_of(txn, unkey(cur.key()), cur.value())
                cur.delete()
                deleted += 1
    return deleted


# ------------------------------------------------------------------ epochs
#
# An elected cluster's leaders are numbered (zq.server.cluster): each writes, as it
# takes over, the first bookmark it will write, into a small history copied to its
# standbys with the other tables (Kafka's leader-epoch checkpoint). The records
# themselves do not change: which epoch wrote a bookmark is the last entry at or below
# it. What the history is for: a node that comes back after others led truncates what
# it wrote (or copied) that the new leader never had (``end_of_epoch``, ``truncate_from``).


def epochs(journal: LmdbJournal, txn=None) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    """The epoch history: (epoch, first bookmark), oldest first."""
    if txn is None:
        with journal.env.begin(db=journal.meta) as own:
            return epochs(journal, own)
    out = []
    with txn.cursor(db=journal.meta) as cur:
        if cur.set_range(EPOCH_PREFIX):
            for k, v in cur:
                if not k.startswith(EPOCH_PREFIX):
                    break
                out.append((unkey(k[len(EPOCH_PREFIX):]), unkey(v)))
    return out


def put_epochs(journal: LmdbJournal, txn, history: list[tuple[int, int]]) -> None:  # type: ignore[no-untyped-def]
    """Make the history exactly ``history``."""
    for epoch, _ in epochs(journal, txn):
        txn.delete(EPOCH_PREFIX + key(epoch), db=journal.meta)
    for epoch, first in history:
        txn.put(EPOCH_PREFIX + key(epoch), key(first), db=journal.meta)


def begin_epoch(journal: LmdbJournal, epoch: int) -> int:
    """This node leads from now on as ``epoch``: note where its records start (synced).
    Returns that bookmark."""
    first = journal.next_seq()
    with journal.env.begin(write=True) as txn:
        history = [(e, f) for e, f in epochs(journal, txn) if e < epoch]
        put_epochs(journal, txn, history + [(epoch, first)])
    journal.env.sync(True)
    return first


def last_epoch(journal: LmdbJournal) -> int:
    history = epochs(journal)
    return history[-1][0] if history else 0


def end_of_epoch(history: list[tuple[int, int]], epoch: int, next_seq: int) -> int:
    """Where ``epoch``'s records end in a journal with this history: the first bookmark
    of the next epoch after it (Kafka's OffsetsForLeaderEpoch), or the journal's end."""
    for e, first in history:
        if e > epoch:
            return first
    return next_seq


def truncate_from(journal: LmdbJournal, seq: int) -> int:
    """Delete every record at or after ``seq`` (and their ids from the index): what a
    node that led, or copied a leader, wrote past where the new leader's history goes
    on. Its copy then goes on from ``seq``. Returns the records deleted."""
    deleted = 0
    start = key(seq)
    if seq < journal.high:
        journal.lower_mark(seq)  # first: the directory's mark never says more than the journal holds
    try:
        with journal.env.begin(write=True) as txn:
            for db in (journal.msgs, journal.events):
                with txn.cursor(db=db) as cur:
                    while cur.set_range(start):
                        if db is journal.msgs:
                            journal.drop_id_of(txn, unkey(cur.key()), cur.value())
                        cur.delete()
                        deleted += 1
            with txn.cursor(db=journal.meta) as cur:
                points = [(k, v) for k, v in (cur if cur.set_range(b"rp:") else ()) if k.startswith(b"rp:")]
            for k, v in points:
                if unkey(v) > seq:
                    txn.put(k, start, db=journal.meta)
            put_epochs(journal, txn, [(e, f) for e, f in epochs(journal, txn) if f < seq])
            txn.put(POSITION_KEY, key(seq), db=journal.meta)
            txn.put(NEXT_FLOOR_KEY, key(seq), db=journal.meta)
        journal.env.sync(True)
    finally:
        journal.release_reader()
    return deleted
