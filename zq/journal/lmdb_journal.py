"""The LMDB journal: one writer, big-endian u64 keys, one transaction per group commit.

Layout (one environment, four named databases):

* ``msgs``   -- seq -> msgpack ``Message``; appended with ``putmulti(append=True)``
* ``events`` -- seq -> msgpack ``Event`` (same global sequence as messages)
* ``queues`` -- queue name -> msgpack ``QueueDeclared`` (queues created at run time)
* ``meta``   -- ``format`` (journal format version), ``rp:<queue>`` recovery points

Durability (DESIGN "Decisions"): ``fsync`` syncs every commit before it returns;
``batch`` commits without syncing and syncs at least every ``fsync_interval_ms``;
``none`` never syncs. The environment is opened with ``sync=False`` and we call
``env.sync(True)`` ourselves, so one commit costs at most one fdatasync.

``writemap=False`` (ANCHORS rule 8): a full disk becomes an error, never a SIGBUS.
The map is sparse and large; if it still fills, the writer doubles it and retries.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import struct
from collections.abc import Iterable, Iterator

import lmdb
import msgspec

from zq.core import records as R
from zq.core.errors import JournalError
from zq.journal.base import declared_name, resolve_copy

log = logging.getLogger("zq.journal")

_KEY = struct.Struct(">Q")
DURABILITY_MODES = ("fsync", "batch", "none")
MAP_SIZE_DEFAULT = 1 << 40  # 1 TiB: sparse, costs nothing without writemap
TRIM_BATCH_MAX = 100_000  # records deleted per commit at most (bounded work per loop)
NEXT_FLOOR_KEY = b"seq:floor"  # meta: bookmarks below this were given out (retention may have deleted them)


_ID = struct.Struct(">QQ")


def id_key(topic: str, msg_id: str) -> bytes:
    """LMDB keys stop at 511 bytes: longer topic+id pairs are keyed by their hash."""
    k = topic.encode() + b"\0" + msg_id.encode()
    return k if len(k) <= 400 else b"\1" + hashlib.blake2b(k, digest_size=32).digest()


def key(seq: int) -> bytes:
    return _KEY.pack(seq)


def unkey(k: bytes) -> int:
    return _KEY.unpack(k)[0]


class LmdbJournal:
    def __init__(
        self,
        path: str,
        *,
        durability: str = "batch",
        fsync_interval_ms: int = 1000,
        map_size: int = MAP_SIZE_DEFAULT,
        readonly: bool = False,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise JournalError(f"durability must be one of {DURABILITY_MODES}, got {durability!r}")
        self.path = path
        self.durability = durability
        self.fsync_interval_ms = fsync_interval_ms
        self.readonly = readonly
        self.lock_fd: int | None = None
        if not readonly:
            try:
                os.makedirs(path, exist_ok=True)
                self.lock_fd = take_writer_lock(path)
            except OSError as exc:  # a read-only file system, no permission, not a directory
                raise JournalError(f"cannot write the journal at {path}: {exc.strerror} "
                                   "(zq serve writes there; `zq journal` commands only read)") from None
        try:
            self.env = lmdb.open(
                path,
                map_size=map_size,
                max_dbs=5,
                sync=False,
                metasync=False,
                writemap=False,
                readonly=readonly,
                lock=True,
                max_readers=256,
            )
        except lmdb.Error as exc:
            self.release_lock()
            raise JournalError(f"cannot open journal at {path}: {exc}") from exc
        try:
            self.msgs = self.env.open_db(b"msgs", create=not readonly)
            self.events = self.env.open_db(b"events", create=not readonly)
            self.queues = self.env.open_db(b"queues", create=not readonly)
            self.meta = self.env.open_db(b"meta", create=not readonly)
            try:  # message ids for dedup: topic \0 id -> seq, ts (journals before dedup lack it)
                self.ids: object | None = self.env.open_db(b"ids", create=not readonly)
            except lmdb.NotFoundError:
                self.ids = None
        except lmdb.Error as exc:
            self.env.close()
            self.release_lock()
            raise JournalError(f"cannot open journal at {path}: {exc}") from exc
        self.staged: list[object] = []
        # The message records of the last two commits, as stored: deliveries mostly
        # send what was just published, and a dict lookup is a third of an LMDB get.
        self.recent: dict[int, bytes] = {}
        self.recent_before: dict[int, bytes] = {}
        # One read transaction for the loop thread's point reads (content, dedup ids),
        # renewed after each commit: a transaction per read cost more than the read.
        self.reader_txn: lmdb.Transaction | None = None
        self.last_sync_ms = 0
        self.unsynced = False
        self.check_format()

    # --------------------------------------------------------------- format

    def check_format(self) -> None:
        with self.env.begin(db=self.meta, write=not self.readonly) as txn:
            raw = txn.get(b"format")
            if raw is None:
                if not self.readonly:
                    txn.put(b"format", str(R.JOURNAL_FORMAT_VERSION).encode())
                return
            version = int(raw)
            if version > R.JOURNAL_FORMAT_VERSION:
                raise JournalError(
                    f"journal at {self.path} has format {version}, newer than this zq knows "
                    f"({R.JOURNAL_FORMAT_VERSION}); upgrade zq to read it"
                )

    # ---------------------------------------------------------------- write

    def append(self, records: Iterable[object]) -> None:
        self.staged.extend(records)

    def commit(self, now_ms: int = 0, *, urgent: bool = True) -> None:
        """Write everything staged in one transaction; sync as the durability says.

        ``urgent`` says something waits on this commit being on disk (a publish
        confirmation, an at-most-once delivery). In ``fsync`` mode only urgent commits
        sync at once; the rest (acks, lease events) ride on the next sync, at most
        ``fsync_interval_ms`` later: losing them to an OS crash means redelivery,
        which at-least-once allows.
        """
        staged, self.staged = self.staged, []
        if staged:
            try:
                self.write(staged)
            except JournalError:
                self.staged = staged + self.staged  # nothing is lost: the next commit tries them again
                raise
            self.unsynced = True
        if not self.unsynced or self.durability == "none":
            return
        if (self.durability == "fsync" and urgent) or now_ms - self.last_sync_ms >= self.fsync_interval_ms:
            self.sync(now_ms)

    def sync(self, now_ms: int = 0) -> None:
        try:
            self.env.sync(True)
        except lmdb.Error as exc:
            raise JournalError(f"journal sync failed: {exc}") from exc
        self.last_sync_ms = now_ms
        self.unsynced = False

    def write(self, staged: list[object]) -> None:
        for _ in range(8):
            try:
                self.write_once(staged)
                self.release_reader()
                return
            except lmdb.MapFullError:
                self.release_reader()
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
            except lmdb.Error as exc:
                raise JournalError(f"journal write failed: {exc}") from exc
        raise JournalError("journal map cannot grow any further")

    def write_once(self, staged: list[object]) -> None:
        enc = R.record_encoder.encode
        msgs: list[tuple[bytes, bytes]] = []
        events: list[tuple[bytes, bytes]] = []
        copies: dict[int, R.Message] = {}
        with self.env.begin(write=True) as txn:
            for rec in staged:
                if type(rec) is R.Message:
                    if rec.msg_id is not None and rec.copy_of is None:
                        txn.put(id_key(rec.topic, rec.msg_id), _ID.pack(rec.seq, rec.ts_ms), db=self.ids, overwrite=False)
                    if rec.copy_of is not None:
                        rec = resolve_copy(rec, copies.get(rec.copy_of) or self.get_in(txn, rec.copy_of))
                    copies[rec.seq] = rec
                    msgs.append((key(rec.seq), enc(rec)))
                elif type(rec) is R.Event:
                    events.append((key(rec.seq), enc(rec)))
                elif type(rec) is R.RecoveryPoint:
                    txn.put(b"rp:" + rec.queue.encode(), key(rec.seq), db=self.meta)
                elif type(rec) is R.QueueDeclared:
                    name = declared_name(rec)
                    txn.put(name.encode(), enc(rec), db=self.queues)
                elif type(rec) is R.QueueDeleted:
                    txn.delete(rec.queue.encode(), db=self.queues)
                else:
                    raise AssertionError(f"unknown record {rec!r}")
            # append=True never overwrites: a bookmark already stored is not added. That
            # only happens with a second writer (see take_writer_lock); refuse the commit
            # rather than confirm a message the journal does not hold.
            for db, rows in ((self.msgs, msgs), (self.events, events)):
                if rows:
                    with txn.cursor(db=db) as cur:
                        _, added = cur.putmulti(rows, append=True)
                    if added != len(rows):
                        raise lmdb.KeyExistsError("a bookmark this commit would store is already in the journal "
                                                  "(another process writing it?)")
        if msgs:  # committed: these are now what the journal holds
            self.recent_before = self.recent
            self.recent = dict(zip(copies, [value for _, value in msgs]))  # copies: seq -> record, in order

    def get_in(self, txn: lmdb.Transaction, seq: int) -> R.Message | None:
        raw = txn.get(key(seq), db=self.msgs)
        return R.message_decoder.decode(raw) if raw is not None else None

    # ----------------------------------------------------------------- read

    def get_message(self, seq: int) -> R.Message | None:
        """The engine's content port: a committed message (dead letters are stored resolved)."""
        raw = self.point_reader().get(_KEY.pack(seq), db=self.msgs)
        return R.message_decoder.decode(raw) if raw is not None else None

    def point_reader(self) -> lmdb.Transaction:
        """The loop thread's read transaction, seeing every commit so far."""
        txn = self.reader_txn
        if txn is None:
            txn = self.reader_txn = self.env.begin()
        return txn

    def release_reader(self) -> None:
        """After a write: drop the reader (its snapshot would pin freed pages and hide the
        commit); the next point read begins a new one. Also before resizing the map."""
        if self.reader_txn is not None:
            self.reader_txn.abort()
            self.reader_txn = None

    def messages_from(self, from_seq: int, limit: int) -> list[R.Message]:
        """The engine's scan port: up to ``limit`` committed messages from ``from_seq`` on
        (TargetQueueDepth reads a queue's inactive part back through it)."""
        out: list[R.Message] = []
        decode = R.message_decoder.decode
        with self.point_reader().cursor(db=self.msgs) as cur:
            if not cur.set_range(_KEY.pack(from_seq)):
                return out
            for v in cur.iternext(keys=False):
                out.append(decode(v))
                if len(out) >= limit:
                    break
        return out

    def find_id(self, topic: str, msg_id: str) -> tuple[int, int] | None:
        """The dedup port: bookmark and time of the first journaled publish of ``msg_id``."""
        if self.ids is None:
            return None
        raw = self.point_reader().get(id_key(topic, msg_id), db=self.ids)
        return _ID.unpack(raw) if raw is not None else None

    def get_messages(self, seqs: list[int]) -> list[R.Message]:
        dec = R.message_decoder.decode
        out = []
        with self.env.begin(db=self.msgs) as txn:
            get = txn.get
            for seq in seqs:
                raw = get(key(seq))
                if raw is None:
                    raise JournalError(f"message {seq} is not in the journal")
                out.append(dec(raw))
        return out

    def get_raw(self, seqs: list[int]) -> list[msgspec.Raw]:
        """Stored message records, undecoded (the server puts them on the wire as is)."""
        out = []
        recent, before = self.recent, self.recent_before
        txn = None
        try:
            for seq in seqs:
                raw = recent.get(seq) or before.get(seq)
                if raw is None:
                    if txn is None:
                        txn = self.env.begin(db=self.msgs)
                    raw = txn.get(_KEY.pack(seq))
                    if raw is None:
                        raise JournalError(f"message {seq} is not in the journal")
                out.append(msgspec.Raw(raw))
        finally:
            if txn is not None:
                txn.abort()
        return out

    def read_messages(self, from_seq: int, to_seq: int | None = None) -> Iterator[R.Message]:
        return self.scan(self.msgs, R.message_decoder.decode, from_seq, to_seq)

    def read_events(self, from_seq: int, to_seq: int | None = None) -> Iterator[R.Event]:
        return self.scan(self.events, R.event_decoder.decode, from_seq, to_seq)

    def scan(self, db, decode, from_seq: int, to_seq: int | None, chunk: int = 50_000):  # type: ignore[no-untyped-def]
        """Iterate in short read transactions so a long scan never pins old pages."""
        stop = key(to_seq) if to_seq is not None else None
        next_seq = from_seq
        while True:
            batch: list[bytes] = []
            finished = True
            with self.env.begin(db=db) as txn, txn.cursor() as cur:
                if not cur.set_range(key(next_seq)):
                    return
                for k, v in cur.iternext():
                    if stop is not None and k >= stop:
                        break
                    batch.append(v)
                    if len(batch) >= chunk:
                        next_seq = unkey(k) + 1
                        finished = False
                        break
            for v in batch:
                yield decode(v)
            if finished:
                return

    def read_raw(self, from_seq: int, max_records: int) -> list[tuple[int, bytes]]:
        """Up to ``max_records`` stored messages from ``from_seq`` on, undecoded (one short txn)."""
        out: list[tuple[int, bytes]] = []
        with self.env.begin(db=self.msgs) as txn, txn.cursor() as cur:
            if not cur.set_range(key(from_seq)):
                return out
            for k, v in cur.iternext():
                out.append((unkey(k), v))
                if len(out) >= max_records:
                    break
        return out

    def seq_at_time(self, ts_ms: int) -> int:
        """The first message bookmark published at or after ``ts_ms`` (binary search)."""
        with self.env.begin(db=self.msgs) as txn, txn.cursor() as cur:
            if not cur.last():
                return 0
            hi = unkey(cur.key()) + 1
            if not cur.first():
                return 0
            lo = unkey(cur.key())
            while lo < hi:
                mid = (lo + hi) // 2
                if not cur.set_range(key(mid)):
                    hi = mid
                    continue
                seq = unkey(cur.key())
                if R.message_decoder.decode(cur.value()).ts_ms >= ts_ms:
                    hi = mid
                else:
                    lo = seq + 1
            return lo

    def declared(self) -> list[R.QueueDeclared]:
        with self.env.begin(db=self.queues) as txn:
            return [R.record_decoder.decode(v) for _, v in txn.cursor()]  # type: ignore[misc]

    def recovery_points(self) -> dict[str, int]:
        out = {}
        with self.env.begin(db=self.meta) as txn, txn.cursor() as cur:
            if cur.set_range(b"rp:"):
                for k, v in cur:
                    if not k.startswith(b"rp:"):
                        break
                    out[k[3:].decode()] = unkey(v)
        return out

    def next_seq(self) -> int:
        """The next bookmark: after every record stored, and after every record retention
        deleted (a journal whose every record was deleted does not number from 1 again:
        old bookmarks would name new messages)."""
        last = 0
        with self.env.begin() as txn:
            for db in (self.msgs, self.events):
                with txn.cursor(db=db) as cur:
                    if cur.last():
                        last = max(last, unkey(cur.key()))
            floor = txn.get(NEXT_FLOOR_KEY, db=self.meta)
        return max(last + 1, unkey(floor) if floor is not None else 0)

    def counts(self) -> dict[str, int]:
        with self.env.begin() as txn:
            return {
                "messages": txn.stat(self.msgs)["entries"],
                "events": txn.stat(self.events)["entries"],
            }

    def size_bytes(self) -> int:
        info, stat = self.env.info(), self.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"]

    # ------------------------------------------------------------ retention

    def trim(self, below_seq: int, older_than_ms: int) -> int:
        """Delete records below ``below_seq`` whose time is before ``older_than_ms``.

        Bounded work per call; returns how many records were deleted.
        """
        deleted = 0
        stop = key(below_seq)
        highest = 0  # the newest bookmark deleted: the journal never numbers below it again
        with self.env.begin(write=True) as txn:
            for db, decode in ((self.msgs, R.message_decoder.decode), (self.events, R.event_decoder.decode)):
                with txn.cursor(db=db) as cur:
                    while deleted < TRIM_BATCH_MAX and cur.first() and cur.key() < stop:
                        rec = decode(cur.value())
                        if rec.ts_ms >= older_than_ms:
                            break
                        highest = max(highest, rec.seq)
                        if db is self.msgs:
                            self.drop_id(txn, rec)  # type: ignore[arg-type]
                        cur.delete()
                        deleted += 1
            if highest:
                floor = txn.get(NEXT_FLOOR_KEY, db=self.meta)
                if floor is None or unkey(floor) <= highest:
                    txn.put(NEXT_FLOOR_KEY, key(highest + 1), db=self.meta)
        if deleted:
            self.unsynced = True
            self.release_reader()
        return deleted

    def drop_id(self, txn: lmdb.Transaction, m: R.Message) -> None:
        """A deleted message's id leaves the dedup index (if the index still names it)."""
        if m.msg_id is not None and self.ids is not None:
            k = id_key(m.topic, m.msg_id)
            raw = txn.get(k, db=self.ids)
            if raw is not None and _ID.unpack(raw)[0] == m.seq:
                txn.delete(k, db=self.ids)

    def reader_check(self) -> int:
        """Free reader slots of dead processes (killed tools pin pages otherwise)."""
        return self.env.reader_check()

    def close(self) -> None:
        self.release_reader()
        try:
            if self.staged:
                self.commit()
            if not self.readonly and self.unsynced:
                self.sync()
        except JournalError as exc:  # a full disk at shutdown: what was never confirmed is not stored
            log.error("journal: %d records not stored at close: %s", len(self.staged), exc)
        finally:
            self.env.close()
            self.release_lock()

    def release_lock(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # closing the descriptor drops the flock
            self.lock_fd = None


LOCK_FILE = "zq.lock"


def take_writer_lock(path: str) -> int:
    """One writer per journal: an exclusive ``flock`` on ``zq.lock`` in the directory.

    LMDB lets several processes write one environment (its write lock only serialises
    transactions), so two ``zq serve`` on one directory would each hand out the same
    bookmarks for different messages. The lock is the kernel's: it ends with the
    process, however it ends (SIGKILL included), so a crash never leaves a stale lock.
    """
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
        finally:
            os.close(fd)
        raise JournalError(f"journal {path} is in use by pid {holder} (one zq serve per data directory)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
