"""The LMDB journal: one writer, big-endian u64 keys, one transaction per group commit.

Layout (one environment, four named databases):

* ``msgs``   -- seq -> msgpack ``Message``; appended with ``putmulti(append=True)``
* ``events`` -- seq -> msgpack ``Event`` (same global sequence as messages)
* ``queues`` -- queue name -> msgpack ``QueueDeclared`` (queues created at run time)
* ``meta``   -- ``format`` (journal format version), ``rp:<queue>`` recovery points,
  ``journal:id``, ``sums:from`` (see below)

Integrity (zq.journal.integrity, docs/reliability.md "Journal integrity"): every
message, event and queue record is stored sealed (its bytes, then their CRC-32) and
checked when read; ``data.mdb``'s meta pages are checked against its size before it is
mapped; ``journal.id`` beside it marks the directory as one that held a journal, up to
a bookmark, so that a missing, emptied or shortened journal is refused, never started
anew in silence. Journal files are created 0600.

Durability (DESIGN "Decisions"): ``fsync`` syncs every commit before it returns;
``batch`` commits without syncing and syncs at least every ``fsync_interval_ms``;
``none`` never syncs. The environment is opened with ``sync=False`` and we call
``env.sync(True)`` ourselves, so one commit costs at most one fdatasync. Batch's
periodic sync, which nothing waits on, runs on a thread of its own (zq.journal.syncer),
so that the loop does not wait on the disk for it (unless the disk is slower than the
interval); fsync's syncs all run in line, in order.

``writemap=False`` (ANCHORS rule 8): a full disk becomes an error, never a SIGBUS.
The map is sparse and large; if it still fills, the writer doubles it and retries.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import struct
import threading
import time
import uuid
import zlib
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from itertools import islice
from operator import itemgetter

import lmdb
import msgspec

from zq.core import records as R
from zq.core.errors import JournalError
from zq.journal import integrity as I
from zq.journal.base import declared_name, resolve_copy
from zq.journal.integrity import RESIDUE, JournalDamaged, seal
from zq.journal.syncer import Syncer

log = logging.getLogger("zq.journal")

_KEY = struct.Struct(">Q")
DURABILITY_MODES = ("fsync", "batch", "none")
SLOW_DISK_SAY_S = 60.0  # a disk slower than fsync_interval is logged at most this often
MAP_SIZE_DEFAULT = 1 << 40  # 1 TiB: sparse, costs nothing without writemap
TRIM_BATCH_MAX = 100_000  # records deleted per commit at most (bounded work per loop)
NEXT_FLOOR_KEY = b"seq:floor"  # meta: bookmarks below this were given out (retention may have deleted them)
ID_KEY = b"journal:id"  # meta: this journal's id (also in the directory's journal.id)
SUMS_FROM_KEY = b"sums:from"  # meta: records at and above this bookmark are sealed (absent: all of them)
# Format 2 (#31): records sealed with a CRC-32. Format 1 journals are read as they are
# and upgraded in place when opened for writing (``sums:from``).
FORMAT_VERSION = R.JOURNAL_FORMAT_VERSION
NEVER = 1 << 64  # sums:from of a format-1 journal read as it is: no record is sealed
_crc32 = zlib.crc32
_SUM = struct.Struct("<I")
SUM_BYTES = I.SUM_BYTES
_UNSEAL = itemgetter(slice(None, -SUM_BYTES))


_ID = struct.Struct(">QQ")


def id_key(topic: str, msg_id: str) -> bytes:
    """LMDB keys stop at 511 bytes: longer topic+id pairs are keyed by their hash."""
    k = topic.encode() + b"\0" + msg_id.encode()
    return k if len(k) <= 400 else b"\1" + hashlib.blake2b(k, digest_size=32).digest()


def key(seq: int) -> bytes:
    return _KEY.pack(seq)


def unkey(k: bytes) -> int:
    try:
        return _KEY.unpack(k)[0]
    except struct.error:  # a stored key is 8 bytes: this one was damaged
        raise JournalDamaged(f"a key of {len(k)} bytes where a bookmark (8 bytes) is stored (a damaged key)") from None


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
        self.file = os.path.join(path, I.DATA_FILE)
        self.durability = durability
        self.fsync_interval_ms = fsync_interval_ms
        self.readonly = readonly
        self.lock_fd: int | None = None
        self.closed = False
        self.mark_lock = threading.Lock()  # the mark is written by this thread and by the syncer's
        self.mark_generation = 0  # raised when the mark is lowered: a sync begun before may not raise it again
        if not readonly:
            try:
                if not os.path.isdir(path):
                    os.makedirs(path, mode=0o700, exist_ok=True)
                self.lock_fd = take_writer_lock(path)
            except OSError as exc:  # a read-only file system, no permission, not a directory
                raise JournalError(f"cannot write the journal at {path}: {exc.strerror} "
                                   "(zq serve writes there; `zq journal` commands only read)") from None
        try:
            self.open_env(map_size)
        except BaseException:
            if hasattr(self, "env"):
                self.env.close()
            self.release_lock()
            raise
        self.staged: list[object] = []
        # The message records of the last two commits, as the wire carries them
        # (unsealed): deliveries mostly send what was just published, and a dict lookup
        # is a third of an LMDB get.
        self.recent: dict[int, bytes] = {}
        self.recent_before: dict[int, bytes] = {}
        # One read transaction for the loop thread's point reads (content, dedup ids),
        # renewed after each commit: a transaction per read cost more than the read.
        self.reader_txn: lmdb.Transaction | None = None
        self.last_sync_ms = 0
        self.unsynced = False
        self.sync_failed = False  # the last sync failed: the next ones are made here, until one works
        self.slow_disk_said = -SLOW_DISK_SAY_S  # when a slow disk was last logged (monotonic)
        self.syncer: Syncer | None = None  # the periodic sync's thread, started by the first one

    def open_env(self, map_size: int) -> None:
        """Check the files, map them, check the format and the identity mark."""
        path = self.path
        try:
            meta = I.read_meta(path)  # before anything maps the file: truncation is an error, not a SIGBUS
        except I.Truncated as exc:
            raise JournalDamaged(f"{exc}; it cannot be served (restore it from a backup or a standby, save what it "
                                 f"holds with `zq journal repair {path}`, or start anew with `zq journal reset "
                                 f"{path}`)") from None
        except JournalDamaged as exc:
            raise JournalDamaged(f"{exc}; it cannot be opened (restore it from a backup or a standby, or start anew "
                                 f"with `zq journal reset {path}`)") from None
        mark = I.read_mark(path)
        self.mark_problem = ""
        if meta is None:
            exists = os.path.exists(self.file)
            state = "empty (0 bytes)" if exists else "missing"
            # LMDB writes its meta pages as it creates data.mdb, and lock.mdb beside it:
            # an empty file, or a lock file alone, is a journal lost, not a new one.
            held = (f"this directory held a journal up to bookmark {mark.next - 1}" if mark is not None else
                    "LMDB created a journal here" if exists or os.path.exists(os.path.join(path, I.LOCK_MDB))
                    else "")
            if held:
                raise JournalDamaged(
                    f"journal {self.file} is {state} but {held}: refusing to start an empty one in its place "
                    f"(restore the file from a backup or a standby, or start anew with `zq journal reset {path}`)")
            if self.readonly:
                raise JournalError(f"no journal at {path} ({self.file} is {state})")
        try:
            self.env = lmdb.open(
                path,
                map_size=map_size,
                max_dbs=5,
                sync=False,
                metasync=False,
                writemap=False,
                readonly=self.readonly,
                lock=True,
                max_readers=256,
                mode=0o700,
            )
            if not self.readonly:
                I.tighten(path)
            self.msgs = self.env.open_db(b"msgs", create=not self.readonly)
            self.events = self.env.open_db(b"events", create=not self.readonly)
            self.queues = self.env.open_db(b"queues", create=not self.readonly)
            self.meta = self.env.open_db(b"meta", create=not self.readonly)
            try:  # message ids for dedup: topic \0 id -> seq, ts (journals before dedup lack it)
                self.ids: object | None = self.env.open_db(b"ids", create=not self.readonly)
            except lmdb.NotFoundError:
                self.ids = None
            self.check_format()
        except lmdb.Error as exc:
            raise self.damaged(exc, opening=True) from None
        try:
            self.high = self.next_seq()  # every bookmark below this is stored
        except (lmdb.Error, JournalDamaged) as exc:
            if not self.readonly:
                raise self.damaged(exc, opening=True) from None
            self.high = 0  # read-only (the tools): what can be read is read, the rest is named
            self.mark_problem = f"journal {self.file}: where it ends cannot be read ({exc})"
        self.mark = mark
        self.mark_at = time.monotonic()
        if mark is not None and (mark.journal != self.id or mark.next > self.high):
            if mark.journal != self.id:
                problem = (f"journal {self.file} is not the journal this directory held ({mark.journal}, up to "
                           f"bookmark {mark.next - 1}) but {self.id or 'one without an id'}")
            else:
                problem = (f"journal {self.file} ends at bookmark {self.high - 1} but this directory held it up to "
                           f"bookmark {mark.next - 1}: records are missing (a truncated or older file?)")
            if not self.readonly:
                raise JournalDamaged(
                    f"{problem}; refusing to serve it as it is (restore the file from a backup or a standby, "
                    f"keep what it holds with `zq journal reset --keep {path}`, or start anew with "
                    f"`zq journal reset {path}`)")
            self.mark_problem = problem
        if not self.readonly and (mark is None or mark.next != self.high):
            self.env.sync(True)  # the mark never says more than the disk holds
            self.write_mark()

    def damaged(self, exc: BaseException, opening: bool = False) -> JournalError:
        """An LMDB error, as one sentence naming the file (and, for damage, the ways out)."""
        if isinstance(exc, lmdb.MapFullError):
            return JournalError(f"journal {self.file}: {exc}")
        if isinstance(exc, (lmdb.ReadonlyError, lmdb.LockError, lmdb.DiskError, lmdb.TlsFullError,
                            lmdb.ReadersFullError)) or type(exc) is lmdb.Error:
            return JournalError(f"cannot open journal at {self.path}: {exc}")
        if opening:
            return JournalDamaged(f"journal {self.file} is damaged and cannot be opened ({exc}): restore it from a "
                                  f"backup or a standby, or start anew with `zq journal reset {self.path}`")
        return JournalDamaged(f"journal {self.file} is damaged ({exc}); `zq journal verify --data {self.path}` "
                              "names what can still be read")

    # --------------------------------------------------------------- format

    def check_format(self) -> None:
        """The stored format: refused when newer than this zq; a format-1 journal is
        read as it is, and upgraded (sealed from its next bookmark on) when written."""
        self.tables_sealed = True  # run-time queue records
        self.sums_from = 0  # records at and above this bookmark are sealed
        with self.env.begin(db=self.meta, write=not self.readonly) as txn:
            raw = txn.get(b"format")
            version = int(raw) if raw is not None else None
            if version is not None and version > FORMAT_VERSION:
                raise JournalError(
                    f"journal at {self.path} has format {version}, newer than this zq knows "
                    f"({FORMAT_VERSION}); upgrade zq to read it"
                )
            journal_id = txn.get(ID_KEY)
            if self.readonly:
                if version is not None and version < 2:
                    self.tables_sealed, self.sums_from = False, NEVER
            elif version is None or version < 2:
                if version is not None:  # format 1: seal from here on, and the queue table now
                    self.sums_from = self.next_seq_in(txn)
                    txn.put(SUMS_FROM_KEY, key(self.sums_from))
                    for k, v in list(txn.cursor(db=self.queues)):
                        txn.put(k, seal(v), db=self.queues)
                    log.warning("journal %s: upgraded to format %d (record checksums from bookmark %d on)",
                                self.path, FORMAT_VERSION, self.sums_from)
                txn.put(b"format", str(FORMAT_VERSION).encode())
            if journal_id is None and not self.readonly:
                journal_id = uuid.uuid4().hex.encode()
                txn.put(ID_KEY, journal_id)
            self.id = journal_id.decode() if journal_id is not None else ""
            raw_from = txn.get(SUMS_FROM_KEY)
            if raw_from is not None:
                self.sums_from = unkey(raw_from)

    # --------------------------------------------------------- identity mark

    def write_mark(self) -> None:
        """Make the directory's mark say every bookmark below ``high`` is here (synced)."""
        self.mark_at = time.monotonic()  # tried again (a full disk) at most every MARK_INTERVAL_S
        with self.mark_lock:
            self.write_mark_locked(self.high)

    def write_mark_locked(self, upto: int) -> None:
        mark = I.Mark(self.id, upto)
        try:
            I.write_mark(self.path, mark)
        except OSError as exc:  # a full disk: the older mark stays, which is still true
            log.error("journal %s: cannot write %s: %s", self.path, I.ID_FILE, exc)
            return
        self.mark = mark

    def synced(self, high: int = 0, *, force: bool = False) -> None:
        """After a sync: every bookmark below ``high`` (and below what this journal
        wrote) is on disk; the mark follows, at most every ``MARK_INTERVAL_S``."""
        if high > self.high:
            self.high = high
        if self.readonly or (self.mark is not None and self.mark.next == self.high):
            return
        if force or time.monotonic() - self.mark_at >= I.MARK_INTERVAL_S:
            self.write_mark()

    def lower_mark(self, high: int) -> None:
        """Before deleting records at and above ``high`` (a deposed leader's, truncated):
        the mark first, so that it never says more than the journal holds (nor does a
        sync begun before, on the syncer's thread: its mark is not written)."""
        self.mark_at = time.monotonic()
        with self.mark_lock:
            self.mark_generation += 1
            self.high = high
            self.write_mark_locked(high)

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
        if self.syncer is not None:
            self.collect_syncs()
        if not self.unsynced or self.durability == "none":
            return
        if self.durability == "fsync" or self.sync_failed:
            # fsync: every sync in line and in order, so that a write-back error reaches
            # the commit whose confirmation waits on it (Linux tells one fdatasync of them).
            if urgent or self.sync_failed or now_ms - self.last_sync_ms >= self.fsync_interval_ms:
                self.sync(now_ms)
        elif now_ms - self.last_sync_ms >= self.fsync_interval_ms:
            if self.syncer is not None and self.syncer.busy():
                self.wait_for_disk()
            self.sync_behind(now_ms)

    def wait_for_disk(self) -> None:
        """The sync asked an interval ago still runs: the disk is slower than
        ``fsync_interval``. Wait for it here, as the loop did before the syncer had a
        thread: what an OS crash may lose stays about one interval of commits, not an
        interval plus however long the disk stalls. Said in the log (at most once a
        minute), and shown by the metrics endpoint, which reads ``sync_stats`` at each
        scrape (STATS waits with the commits)."""
        syncer = self.syncer
        assert syncer is not None
        started = time.monotonic()
        say = started - self.slow_disk_said >= SLOW_DISK_SAY_S
        if say:
            self.slow_disk_said = started
            log.warning("journal %s: the disk is slow: the periodic sync has run for %.0f ms (fsync_interval is %d ms); "
                        "commits wait for it", self.path, syncer.running_ms(), self.fsync_interval_ms)
        syncer.wait_idle()
        if say:
            log.warning("journal %s: commits waited %.0f ms for the disk", self.path, (time.monotonic() - started) * 1000)
        self.collect_syncs()

    def sync(self, now_ms: int = 0) -> None:
        try:
            self.env.sync(True)
        except lmdb.Error as exc:
            raise JournalError(f"journal sync failed: {exc}") from exc
        self.last_sync_ms = now_ms
        self.unsynced = False
        self.sync_failed = False
        if self.mark is None or self.mark.next != self.high:
            self.synced()

    def sync_behind(self, now_ms: int) -> None:
        """The periodic sync, on the syncer's thread (zq.journal.syncer): nothing waits
        on it. What is committed now is on disk when it ends; then the mark follows, at
        most every ``MARK_INTERVAL_S``, unless the mark was lowered meanwhile."""
        if self.closed:  # (close's last commit: it syncs in line)
            self.sync(now_ms)
            return
        if self.syncer is None:
            self.syncer = Syncer("zq-journal-sync")
        env, high, generation = self.env, self.high, self.mark_generation
        mark_due = (self.mark is None or self.mark.next != high) and time.monotonic() - self.mark_at >= I.MARK_INTERVAL_S
        if mark_due:
            self.mark_at = time.monotonic()

        def job() -> int:
            env.sync(True)
            if mark_due:
                with self.mark_lock:
                    if generation == self.mark_generation:
                        self.write_mark_locked(high)
            return high

        try:
            self.syncer.ask(job)
        except RuntimeError as exc:  # no thread could start (a process at its thread limit): made here
            log.warning("journal %s: the periodic sync runs in line: %s", self.path, exc)
            self.sync(now_ms)
            return
        self.last_sync_ms = now_ms
        self.unsynced = False

    def sync_stats(self) -> dict[str, float]:
        """STATS ``server.journal``: the periodic sync now running for how long, and the
        last one's time, in ms (0 before the first)."""
        syncer = self.syncer
        if syncer is None:
            return {"sync_running_ms": 0.0, "sync_last_ms": 0.0}
        return {"sync_running_ms": round(syncer.running_ms(), 3), "sync_last_ms": round(syncer.last_ms, 3)}

    def collect_syncs(self) -> None:
        """A sync that failed on the syncer's thread fails the next commit here, as one
        made here would (the loop pauses publishing and tries again): what it would have
        synced is unsynced again, and the next syncs are made here until one works."""
        _, error = self.syncer.take()  # type: ignore[union-attr]
        if error is not None:
            self.unsynced = True
            self.sync_failed = True
            raise JournalError(f"journal sync failed: {error}") from error

    def write(self, staged: list[object]) -> None:
        for _ in range(8):
            try:
                self.write_once(staged)
                self.release_reader()
                return
            except lmdb.MapFullError:
                self.release_reader()
                if self.syncer is not None:  # (a sync starting while the map moves fails: EINVAL)
                    self.syncer.wait_idle()
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
            except lmdb.Error as exc:
                raise JournalError(f"journal write failed: {exc}") from exc
        raise JournalError("journal map cannot grow any further")

    def write_once(self, staged: list[object]) -> None:
        enc = R.record_encoder.encode
        crc, pack = _crc32, _SUM.pack  # each record is stored sealed: its bytes, then their CRC-32
        msgs: list[tuple[bytes, bytes]] = []
        events: list[tuple[bytes, bytes]] = []
        copies: dict[int, R.Message] = {}
        plain: list[bytes] = []  # the message records as the wire carries them (unsealed)
        with self.env.begin(write=True) as txn:
            for rec in staged:
                if type(rec) is R.Message:
                    if rec.msg_id is not None and rec.copy_of is None:
                        txn.put(id_key(rec.topic, rec.msg_id), _ID.pack(rec.seq, rec.ts_ms), db=self.ids, overwrite=False)
                    if rec.copy_of is not None:
                        rec = self.resolve(rec, copies.get(rec.copy_of), txn)
                    copies[rec.seq] = rec
                    raw = enc(rec)
                    plain.append(raw)
                    msgs.append((key(rec.seq), raw + pack(crc(raw))))
                elif type(rec) is R.Event:
                    raw = enc(rec)
                    events.append((key(rec.seq), raw + pack(crc(raw))))
                elif type(rec) is R.RecoveryPoint:
                    txn.put(b"rp:" + rec.queue.encode(), key(rec.seq), db=self.meta)
                elif type(rec) is R.QueueDeclared:
                    name = declared_name(rec)
                    txn.put(name.encode(), seal(enc(rec)), db=self.queues)
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
            self.recent = dict(zip(copies, plain))  # copies: seq -> record, in order
            top = unkey(msgs[-1][0]) + 1
            if top > self.high:
                self.high = top
        if events:
            top = unkey(events[-1][0]) + 1
            if top > self.high:
                self.high = top

    def resolve(self, rec: R.Message, original: R.Message | None, txn: lmdb.Transaction) -> R.Message:
        """A copy (dead letter, move, redrive) with its original's payload and headers;
        an original damaged in the journal is copied as missing, and says so."""
        if original is not None:
            return resolve_copy(rec, original)
        try:
            return resolve_copy(rec, self.get_in(txn, rec.copy_of))  # type: ignore[arg-type]
        except JournalDamaged as exc:
            log.error("%s: its copy %d is stored without it", exc, rec.seq)
            out = resolve_copy(rec, None)
            out.headers["zq.missing"] = "original-damaged"
            return out

    def get_in(self, txn: lmdb.Transaction, seq: int) -> R.Message | None:
        raw = txn.get(key(seq), db=self.msgs)
        return self.decode_message(seq, raw) if raw is not None else None

    def open_record(self, seq: int, stored: bytes, what: str = "message") -> bytes:
        """A stored record's bytes, its checksum checked (JournalDamaged if it fails).
        (A bytes slice: cheaper than a memoryview's, and msgspec decodes bytes faster.)"""
        if seq < self.sums_from:
            return stored
        if _crc32(stored) != RESIDUE or len(stored) <= SUM_BYTES:
            raise JournalDamaged(f"journal {self.file}: the {what} record at bookmark {seq} is damaged (its checksum "
                                 f"does not match); `zq journal verify --data {self.path}` names every damaged one",
                                 [seq])
        return stored[:-SUM_BYTES]

    def decode_message(self, seq: int, stored: bytes) -> R.Message:
        try:
            m = R.message_decoder.decode(self.open_record(seq, stored))
        except msgspec.MsgspecError as exc:
            raise JournalDamaged(f"journal {self.file}: the message record at bookmark {seq} does not decode "
                                 f"({exc})", [seq]) from None
        if m.seq != seq:
            raise JournalDamaged(f"journal {self.file}: the message record under bookmark {seq} says it is {m.seq} "
                                 "(a damaged key)", [seq])
        return m

    # ----------------------------------------------------------------- read
    #
    # Every read of a message or event record opens it (``open_record``: its checksum,
    # and its bookmark against its key where the record is decoded): a damaged record is
    # a ``JournalDamaged`` naming its bookmark, never a wrong message delivered.

    def get_message(self, seq: int) -> R.Message | None:
        """The engine's content port: a committed message (dead letters are stored resolved)."""
        raw = self.point_reader().get(_KEY.pack(seq), db=self.msgs)
        return self.decode_message(seq, raw) if raw is not None else None

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
        decode = self.decode_message
        with self.point_reader().cursor(db=self.msgs) as cur:
            if not cur.set_range(_KEY.pack(from_seq)):
                return out
            for k, v in cur.iternext():
                out.append(decode(unkey(k), v))
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
        decode = self.decode_message
        out = []
        with self.env.begin(db=self.msgs) as txn:
            get = txn.get
            for seq in seqs:
                raw = get(key(seq))
                if raw is None:
                    raise JournalError(f"message {seq} is not in the journal")
                out.append(decode(seq, raw))
        return out

    def get_raw(self, seqs: list[int]) -> list[msgspec.Raw]:
        """Message records as the wire carries them (unsealed, undecoded: the server puts
        them on the wire as they are), each checked."""
        out = []
        recent, before = self.recent, self.recent_before
        sums_from = self.sums_from
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
                    # (Its key against its bookmark was checked at recovery, or it was
                    # written since: the checksum is what a delivery checks.)
                    if seq >= sums_from:
                        if _crc32(raw) != RESIDUE:
                            self.open_record(seq, raw)  # raises, naming it
                        raw = raw[:-SUM_BYTES]
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
        """Iterate in short read transactions so a long scan never pins old pages; each
        record checked: its checksum, and its bookmark against its key.

        Recovery reads most of a start's time here, so a chunk's keys and values are read
        apart (no tuple per record), its checksums checked by ``map`` in C, its records
        decoded one at a time as they are taken, and their bookmarks matched to the keys
        at the chunk's end. What fails is read again record by record, to name it."""
        stop = key(to_seq) if to_seq is not None else None
        next_seq = from_seq
        while True:
            try:
                with self.env.begin(db=db) as txn, txn.cursor() as cur:
                    if not cur.set_range(key(next_seq)):
                        return
                    keys = list(islice(cur.iternext(keys=True, values=False), chunk))
                    cur.set_range(keys[0])
                    values = list(islice(cur.iternext(keys=False, values=True), len(keys)))
            except lmdb.Error as exc:
                raise self.damaged(exc) from None
            finished = len(keys) < chunk
            if stop is not None and keys[-1] >= stop:
                n = bisect_left(keys, stop)
                del keys[n:], values[n:]
                finished = True
                if not keys:
                    return
            if any(len(k) != 8 for k in (keys[0], keys[-1])):
                for k, v in zip(keys, values):
                    self.open_scanned(db, decode, k, v)  # raises at the damaged key
            next_seq = unkey(keys[-1]) + 1
            if unkey(keys[0]) < self.sums_from or not all(map(RESIDUE.__eq__, map(_crc32, values))):
                for k, v in zip(keys, values):  # not all sealed (a format-1 journal), or damaged
                    yield self.open_scanned(db, decode, k, v)
            else:
                seqs: list[int] = []
                taken = seqs.append
                try:
                    for rec in map(decode, map(_UNSEAL, values)):
                        taken(rec.seq)
                        yield rec
                except msgspec.MsgspecError:
                    i = len(seqs)
                    self.open_scanned(db, decode, keys[i], values[i])  # raises, naming it
                if list(map(_KEY.pack, seqs)) != keys:
                    for k, v in zip(keys, values):
                        self.open_scanned(db, decode, k, v)  # raises at the first misplaced one
            if finished:
                return

    def open_scanned(self, db, decode, k: bytes, v: bytes):  # type: ignore[no-untyped-def]
        """One scanned record, checked: JournalDamaged naming what is wrong with it."""
        what = "message" if db is self.msgs else "event"
        try:
            seq = unkey(k)
        except JournalDamaged as exc:
            raise JournalDamaged(f"journal {self.file}: a {what} record has {exc}") from None
        if seq >= self.sums_from:
            v = self.open_record(seq, v, what)
        try:
            rec = decode(v)
        except msgspec.MsgspecError as exc:
            raise JournalDamaged(f"journal {self.file}: the {what} record at bookmark {seq} does not decode ({exc})",
                                 [seq]) from None
        if rec.seq != seq:
            raise JournalDamaged(f"journal {self.file}: the {what} record under bookmark {seq} says it is {rec.seq} "
                                 "(a damaged key)", [seq])
        return rec

    def read_raw(self, from_seq: int, max_records: int, max_bytes: int = 0) -> list[tuple[int, bytes]]:
        """Up to ``max_records`` stored messages from ``from_seq`` on, unsealed and
        undecoded (one short txn); with ``max_bytes``, none after the one that brings
        what it returns to that many bytes. A damaged one is left out, and logged."""
        out: list[tuple[int, bytes]] = []
        size = 0
        with self.env.begin(db=self.msgs) as txn, txn.cursor() as cur:
            if not cur.set_range(key(from_seq)):
                return out
            for k, v in cur.iternext():
                seq = unkey(k)
                try:
                    raw = self.open_record(seq, v)
                    out.append((seq, raw))
                    size += len(raw)
                except JournalDamaged as exc:
                    log.error("%s (left out of a replay)", exc)
                if len(out) >= max_records or (max_bytes and size >= max_bytes):
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
                if self.decode_message(seq, cur.value()).ts_ms >= ts_ms:
                    hi = mid
                else:
                    lo = seq + 1
            return lo

    def open_table(self, name: bytes, stored: bytes) -> bytes:
        """A run-time queue record, its checksum checked."""
        if not self.tables_sealed:
            return stored
        if _crc32(stored) != RESIDUE or len(stored) <= SUM_BYTES:
            raise JournalDamaged(f"journal {self.file}: the declaration of run-time queue "
                                 f"{name.decode(errors='replace')!r} is damaged (its checksum does not match)")
        return stored[:-SUM_BYTES]

    def declared_raw(self) -> list[bytes]:
        """The run-time queue records as the wire carries them (a standby's tables)."""
        with self.env.begin(db=self.queues) as txn:
            return [bytes(self.open_table(k, v)) for k, v in txn.cursor()]

    def declared(self) -> list[R.QueueDeclared]:
        return [R.record_decoder.decode(v) for v in self.declared_raw()]  # type: ignore[misc]

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
        with self.env.begin() as txn:
            return self.next_seq_in(txn)

    def next_seq_in(self, txn: lmdb.Transaction) -> int:
        last = 0
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

        Bounded work per call; returns how many records were deleted. A damaged record
        stops it (JournalDamaged, logged by the loop): retention never guesses a time.
        """
        deleted = 0
        stop = key(below_seq)
        highest = 0  # the newest bookmark deleted: the journal never numbers below it again
        try:
            with self.env.begin(write=True) as txn:
                for db, decode, what in ((self.msgs, R.message_decoder.decode, "message"),
                                         (self.events, R.event_decoder.decode, "event")):
                    with txn.cursor(db=db) as cur:
                        while deleted < TRIM_BATCH_MAX and cur.first() and cur.key() < stop:
                            seq = unkey(cur.key())
                            try:
                                rec = decode(self.open_record(seq, cur.value(), what))
                            except (JournalDamaged, msgspec.MsgspecError) as exc:
                                # Below every queue's recovery point: no queue needs it, and
                                # nothing can read it. It goes (its time unknown), said once.
                                log.error("retention deleted a damaged record no queue needed: %s", exc)
                                highest = max(highest, seq)
                                cur.delete()
                                deleted += 1
                                continue
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
        except lmdb.Error as exc:  # a damaged page: retention stops there (the loop logs it), serving goes on
            self.release_reader()
            raise self.damaged(exc) from None
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

    def drop_id_of(self, txn: lmdb.Transaction, seq: int, stored: bytes) -> None:
        """``drop_id`` for a stored message about to be deleted (a damaged one keeps its
        index entry: it names a bookmark no longer there, which dedup tolerates)."""
        try:
            self.drop_id(txn, R.message_decoder.decode(self.open_record(seq, stored)))
        except (JournalDamaged, msgspec.MsgspecError):
            pass

    def reader_check(self) -> int:
        """Free reader slots of dead processes (killed tools pin pages otherwise)."""
        return self.env.reader_check()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.release_reader()
        try:
            try:
                if self.staged:
                    self.commit()
            except JournalError as exc:  # a full disk at shutdown: what was never confirmed is not stored
                if self.staged:
                    log.error("journal: %d records not stored at close: %s", len(self.staged), exc)
                else:  # (written: their sync failed, and is made again below)
                    log.error("journal: %s; syncing again at close", exc)
            if self.syncer is not None:  # what it was asked runs first
                self.syncer.stop()
                error = self.syncer.take()[1]
                if error is not None:
                    log.error("journal: the last periodic sync failed (%s); syncing again at close", error)
                    self.unsynced = True
            try:
                if not self.readonly and self.unsynced:
                    self.sync()
                if not self.readonly and not self.unsynced:
                    self.synced(force=True)  # a clean stop: the mark says where the journal ends
            except JournalError as exc:
                log.error("journal: not synced at close: %s", exc)
        finally:
            try:
                if self.syncer is not None:
                    self.syncer.stop()  # (a commit that raised anything else skipped the stop above)
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
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, I.FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
        finally:
            os.close(fd)
        raise JournalError(f"journal {path} is in use by pid {holder} (one zq serve per data directory)") from None
    os.fchmod(fd, I.FILE_MODE)  # whatever the umask
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
