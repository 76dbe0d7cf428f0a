"""What tells a damaged journal from an empty one: record checksums, LMDB's meta pages
read before the file is mapped, and the directory's identity mark.

Three checks, each for a failure LMDB alone turns into silence or a crash
(docs/reliability.md, "Journal integrity"):

* **Record checksums.** Every message, event and run-time queue record is stored as
  its msgpack bytes followed by the CRC-32 (zlib's, little-endian) of those bytes. A
  value with its CRC appended has a fixed CRC of its own (``RESIDUE``): checking a
  stored value is one ``zlib.crc32`` call over it, no slicing. Journals of format 1
  have no checksums; one upgraded in place has them from the bookmark its meta key
  ``sums:from`` names on.
* **The file before the map.** LMDB maps ``data.mdb`` and trusts its meta pages: a file
  shorter than the pages they name is a SIGBUS at the first read past its end, an empty
  one is silently a new journal. ``read_meta`` reads both meta pages with plain reads
  and compares the file's size with the pages the newer one says are in use, before
  anything maps the file.
* **The identity mark.** ``journal.id`` beside ``data.mdb``: the journal's id and a
  bookmark every record below which was stored and synced (written atomically, at open,
  at close and at most every ``MARK_INTERVAL_S`` after a sync). A directory with a mark
  whose journal is missing, empty or ends below it was damaged, not new.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from zq.core.errors import JournalError

RESIDUE = 0x2144DF1C  # zlib.crc32(data + crc32(data) as 4 little-endian bytes), whatever the data
SUM_BYTES = 4
_SUM = struct.Struct("<I")
_crc32 = zlib.crc32

DATA_FILE = "data.mdb"
LOCK_MDB = "lock.mdb"
ID_FILE = "journal.id"
FILE_MODE = 0o600  # journal files: the owner alone reads them (messages are often private)
MARK_INTERVAL_S = 5.0  # the identity mark follows the synced journal at most this far behind


class JournalDamaged(JournalError):
    """The journal's files are damaged (a record's checksum, a key, a page, a truncated
    file). ``bookmarks`` names the damaged records when it is known which."""

    def __init__(self, message: str, bookmarks: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.bookmarks = sorted(set(bookmarks))


class Truncated(JournalDamaged):
    """``data.mdb`` is shorter than the pages its meta page says are in use."""

    def __init__(self, message: str, size: int, needed: int) -> None:
        super().__init__(message)
        self.size, self.needed = size, needed


def seal(raw: bytes) -> bytes:
    """A record as stored: its bytes and their CRC-32."""
    return raw + _SUM.pack(_crc32(raw))


def sound(stored: bytes) -> bool:
    """Does a stored (sealed) value hold the bytes it was sealed with?"""
    return len(stored) > SUM_BYTES and _crc32(stored) == RESIDUE


def unseal(stored: bytes) -> bytes:
    return stored[:-SUM_BYTES]


def ranges_text(seqs: Iterable[int], most: int = 20) -> str:
    """``17, 40-42, 90`` (at most ``most`` items, then how many more)."""
    seqs = sorted(set(seqs))
    items: list[str] = []
    i = 0
    while i < len(seqs):
        j = i
        while j + 1 < len(seqs) and seqs[j + 1] == seqs[j] + 1:
            j += 1
        items.append(str(seqs[i]) if i == j else f"{seqs[i]}-{seqs[j]}")
        i = j + 1
    if len(items) > most:
        return ", ".join(items[:most]) + f" and {len(items) - most} more ranges"
    return ", ".join(items)


# ------------------------------------------------------------- the meta pages
#
# mdb.c (LMDB 0.9): a page starts with a 16-byte header (pgno u64, pad u16, flags u16,
# lower/upper u16 u16); pages 0 and 1 are meta pages (flag P_META), each holding an
# MDB_meta after the header: magic u32, version u32, address, mapsize, two MDB_db of 48
# bytes (the free list's first u32 is the page size), last_pg u64, txnid u64. The meta
# page with the higher txnid is the current one.

P_META = 0x08
MDB_MAGIC = 0xBEEFC0DE
MDB_DATA_VERSION = 1
P_INVALID = (1 << 64) - 1
_HEAD = struct.Struct("<QHH")  # pgno, pad, flags
_META = struct.Struct("<IIQQ")  # magic, version, address, mapsize
_OFF_PSIZE = 16 + 24  # the free DB's md_pad: the page size
_OFF_FREE_ROOT = 16 + 24 + 40
_OFF_MAIN_ROOT = 16 + 72 + 40
_OFF_LAST = 16 + 120
_META_BYTES = 16 + 136


@dataclass
class MetaPages:
    size: int  # of data.mdb, in bytes
    psize: int
    last_pg: int  # of the current meta page
    txnid: int

    @property
    def used_bytes(self) -> int:
        return (self.last_pg + 1) * self.psize


def read_meta(path: str) -> MetaPages | None:
    """``data.mdb``'s meta pages, checked against the file's size without mapping it:
    None when there is no file or it is empty (no journal was ever written, or one was
    lost: the identity mark tells which); ``JournalDamaged`` naming what is wrong when
    the file is shorter than its meta pages say or they are not LMDB's.

    A live journal's writer may be writing a meta page as it is read (a torn read), so
    what is found wrong is read again, twice, before it is said."""
    for attempt in range(3):
        try:
            return read_meta_once(path)
        except Truncated:
            if attempt == 2:
                raise
        except JournalDamaged:
            if attempt == 2:
                raise
        time.sleep(0.01)
    raise AssertionError("unreachable")


def read_meta_once(path: str) -> MetaPages | None:
    file = os.path.join(path, DATA_FILE)
    try:
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_META_BYTES)
            if not head:
                return None
            if len(head) < _META_BYTES:
                raise JournalDamaged(f"journal {file} is truncated: {size} bytes, shorter than LMDB's first meta page")
            first = parse_meta(file, 0, head)
            psize = struct.unpack_from("<I", head, _OFF_PSIZE)[0]
            if psize < 512 or psize > 65536 or psize & (psize - 1):
                raise JournalDamaged(f"journal {file} is damaged: its first meta page says the page size is {psize}")
            if size < 2 * psize:
                raise JournalDamaged(f"journal {file} is truncated: {size} bytes, shorter than LMDB's two meta pages "
                                     f"({2 * psize} bytes)")
            f.seek(psize)
            page = f.read(_META_BYTES)
            second = parse_meta(file, 1, page)
            if struct.unpack_from("<I", page, _OFF_PSIZE)[0] != psize:
                raise JournalDamaged(f"journal {file} is damaged: its two meta pages disagree on the page size")
            # The size after the meta pages: LMDB writes a commit's pages before its meta
            # page, so a file that grows meanwhile is never taken for a truncated one.
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise JournalError(f"journal {file} is a directory, not a file") from None
    except PermissionError as exc:
        raise JournalError(f"cannot read journal {file}: {exc.strerror}") from None
    last_pg, txnid, roots = second if second[1] > first[1] else first  # LMDB's choice: the newer
    meta = MetaPages(size, psize, last_pg, txnid)
    if size < meta.used_bytes:
        raise Truncated(f"journal {file} is truncated (or its meta page is damaged): {size} bytes, but its meta "
                        f"page says {meta.used_bytes} bytes are in use (pages 0-{last_pg} of {psize} bytes)",
                        size, meta.used_bytes)
    for root in roots:
        if root != P_INVALID and root > last_pg:
            raise JournalDamaged(f"journal {file} is damaged: its meta page names root page {root}, past its last "
                                 f"page {last_pg}")
    return meta


def meta_roots(path: str, psize: int) -> dict[int, tuple[int, int]]:
    """Each meta page's transaction id -> (main table's root page, its depth), read
    with plain reads (after ``read_meta`` found the file sound)."""
    out = {}
    with open(os.path.join(path, DATA_FILE), "rb") as f:
        for n in (0, 1):
            for _ in range(5):  # the same bytes twice: not a meta page the writer was writing
                f.seek(n * psize)
                page = f.read(_META_BYTES)
                f.seek(n * psize)
                if f.read(_META_BYTES) == page:
                    break
            txnid = struct.unpack_from("<Q", page, _OFF_LAST + 8)[0]
            depth = struct.unpack_from("<H", page, _OFF_MAIN_ROOT - 34)[0]
            out[txnid] = (struct.unpack_from("<Q", page, _OFF_MAIN_ROOT)[0], depth)
    return out


def parse_meta(file: str, n: int, page: bytes) -> tuple[int, int, tuple[int, int]]:
    """(last_pg, txnid, (free root, main root)) of meta page ``n``; JournalDamaged if it is not one."""
    if len(page) < _META_BYTES:
        raise JournalDamaged(f"journal {file} is truncated: meta page {n} is incomplete")
    _, _, flags = _HEAD.unpack_from(page, 0)
    magic, version, _, _ = _META.unpack_from(page, 16)
    if not flags & P_META or magic != MDB_MAGIC:
        raise JournalDamaged(f"journal {file} is damaged (or not an LMDB file): meta page {n} is not an LMDB meta page")
    if version != MDB_DATA_VERSION:
        raise JournalDamaged(f"journal {file} is damaged (or of another LMDB version): meta page {n} says "
                             f"data version {version}")
    last_pg, txnid = struct.unpack_from("<QQ", page, _OFF_LAST)
    roots = (struct.unpack_from("<Q", page, _OFF_FREE_ROOT)[0], struct.unpack_from("<Q", page, _OFF_MAIN_ROOT)[0])
    return last_pg, txnid, roots


# ------------------------------------------------------------ the identity mark


@dataclass
class Mark:
    journal: str  # the journal's id (also in its meta, key ``journal:id``)
    next: int  # every bookmark below this was stored and synced in this directory


def read_mark(path: str) -> Mark | None:
    file = os.path.join(path, ID_FILE)
    try:
        with open(file, "rb") as f:
            text = f.read(4096)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalError(f"cannot read {file}: {exc.strerror}") from None
    try:
        doc = json.loads(text)
        return Mark(str(doc["journal"]), int(doc["next"]))
    except (ValueError, KeyError, TypeError):
        raise JournalDamaged(f"{file} (this directory's journal identity) is damaged; if {path}/{DATA_FILE} is "
                             f"the right journal, `zq journal reset --keep {path}` writes it again") from None


def write_mark(path: str, mark: Mark) -> None:
    """Atomically: a temporary file, synced, renamed over the old one."""
    file = os.path.join(path, ID_FILE)
    tmp = file + ".tmp"
    body = json.dumps({"journal": mark.journal, "next": mark.next,
                       "note": "zq: the journal this directory holds; see `zq journal reset --help`"}).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        if os.write(fd, body + b"\n") != len(body) + 1:
            raise OSError(28, "short write")
        os.fsync(fd)
    except OSError:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, file)


def tighten(path: str, names: Iterable[str] = (DATA_FILE, LOCK_MDB, ID_FILE)) -> None:
    """Journal files are the owner's alone, whatever the umask was."""
    for name in names:
        try:
            os.chmod(os.path.join(path, name), FILE_MODE)
        except FileNotFoundError:
            pass
