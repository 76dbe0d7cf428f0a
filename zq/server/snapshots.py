"""Copies of the leader's whole journal, for a standby too far behind to catch up.

A standby copies records from its position; when the leader's retention has already
deleted records it never copied, records cannot bring it back. It asks for a snapshot
instead: LMDB's own copy of the environment (``env.copy(compact=True)``, a consistent
read of the committed journal, made in a thread: py-lmdb releases the GIL while it
copies), written beside the journal, read in chunks over ADMIN ``snapshot-read``, and
deleted once read to its end, when its reader's session ends, or after
``SNAPSHOT_TTL_MS``. The standby installs it as its journal and goes on copying from
its end (``zq.server.standby``).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from dataclasses import dataclass, field

from zq.core.errors import LimitError, ProtocolError
from zq.journal.integrity import tighten
from zq.journal.lmdb_journal import LmdbJournal

log = logging.getLogger("zq.server")

SNAPSHOTS_MAX = 2  # copies on the leader's disk at once (each a whole journal), a dropped one still copying too
SNAPSHOT_TTL_MS = 600_000  # an abandoned one is deleted after this long
CHUNK_BYTES_MAX = 4 << 20  # one snapshot-read answer


@dataclass
class Snapshot:
    id: int
    peer_id: bytes
    path: str
    started_ms: int
    ready: bool = False
    error: str = ""
    size: int = 0
    next_seq: int = 0  # the journal's end when the copy's read began (at most: the copy may hold more)
    thread: threading.Thread | None = field(default=None, repr=False)


class Snapshots:
    def __init__(self, journal: LmdbJournal) -> None:
        self.journal = journal
        self.dir = os.path.join(journal.path, "snapshots")
        self.open: dict[int, Snapshot] = {}
        # Ids whose copy is on disk: a snapshot dropped while copying stays here until its
        # thread removes its files, so ending sessions cannot pile copies up (once: 12 at once).
        self.on_disk: set[int] = set()
        self.serial = 0
        self.lock = threading.Lock()  # a copy finishing and its snapshot being dropped
        shutil.rmtree(self.dir, ignore_errors=True)  # left by a dispatcher that died copying

    def begin(self, peer_id: bytes, now: int) -> Snapshot:
        with self.lock:
            if len(self.on_disk) >= SNAPSHOTS_MAX:
                raise LimitError(f"at most {SNAPSHOTS_MAX} journal snapshots on disk at once (counting copies "
                                 "still being removed): try again later")
            self.serial += 1
            self.on_disk.add(self.serial)
        path = os.path.join(self.dir, str(self.serial))
        os.makedirs(path, mode=0o700, exist_ok=True)
        snap = Snapshot(self.serial, peer_id, path, now, next_seq=self.journal.next_seq())
        snap.thread = threading.Thread(target=self.copy, args=(snap,), name="zq-snapshot", daemon=True)
        self.open[snap.id] = snap
        snap.thread.start()
        return snap

    def copy(self, snap: Snapshot) -> None:
        try:
            self.journal.env.copy(snap.path, compact=True)
            tighten(snap.path)  # the copy is as private as the journal
            size = os.path.getsize(os.path.join(snap.path, "data.mdb"))
        except Exception as exc:  # noqa: BLE001 -- a full disk, most likely: the standby is told
            snap.error = f"the snapshot failed: {exc}"
            log.error("journal snapshot %d: %s", snap.id, exc)
            size = -1
        with self.lock:
            if snap.id not in self.open:  # dropped while copying
                shutil.rmtree(snap.path, ignore_errors=True)
                self.on_disk.discard(snap.id)
            elif size >= 0:
                snap.size, snap.ready = size, True

    def get(self, sid: int, peer_id: bytes) -> Snapshot:
        snap = self.open.get(sid)
        if snap is None or snap.peer_id != peer_id:
            raise ProtocolError(f"no snapshot {sid} of this session")
        return snap

    def read(self, sid: int, peer_id: bytes, offset: int, size: int) -> bytes:
        snap = self.get(sid, peer_id)
        if not snap.ready:
            raise ProtocolError(f"snapshot {sid} is not ready")
        if not 0 <= offset <= snap.size or not 1 <= size <= CHUNK_BYTES_MAX:
            raise ProtocolError(f"a snapshot read is offset 0..{snap.size}, size 1..{CHUNK_BYTES_MAX}")
        with open(os.path.join(snap.path, "data.mdb"), "rb") as f:
            f.seek(offset)
            chunk = f.read(size)
        if offset + len(chunk) >= snap.size:
            self.drop(sid)  # read to its end
        return chunk

    def drop(self, sid: int) -> None:
        with self.lock:
            snap = self.open.pop(sid, None)
            if snap is not None and (snap.ready or snap.error):  # (a copy under way removes its own files)
                shutil.rmtree(snap.path, ignore_errors=True)
                self.on_disk.discard(snap.id)

    def drop_peer(self, peer_id: bytes) -> None:
        for sid in [s.id for s in self.open.values() if s.peer_id == peer_id]:
            self.drop(sid)

    def expire(self, now: int) -> None:
        for sid in [s.id for s in self.open.values() if now - s.started_ms > SNAPSHOT_TTL_MS]:
            self.drop(sid)

    def close(self) -> None:
        """At shutdown, before the journal closes: wait for copies under way."""
        for snap in list(self.open.values()):
            if snap.thread is not None:
                snap.thread.join()
        for sid in list(self.open):
            self.drop(sid)
