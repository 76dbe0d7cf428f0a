"""Real journal files to damage: a journal with messages, events and a run-time queue,
and ways to find, in ``data.mdb``, the bytes of a payload, a key, the messages' branch
page and the meta pages (LMDB 0.9's layout, as zq.journal.integrity reads it)."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from zq.core import QueueSettings
from zq.core import records as R
from zq.journal.lmdb_journal import LmdbJournal

from tests.core.helpers import Harness

PAGE = 4096
COMMITS = 6
PER_COMMIT = 100  # 600 messages of ~200 bytes: ~35 leaf pages under one branch page


@dataclass
class Built:
    path: Path
    seqs: list[int]  # the messages' bookmarks, in publish order
    acked: list[int]
    next_seq: int  # the journal's next bookmark when it was closed

    @property
    def file(self) -> Path:
        return self.path / "data.mdb"


def marker(i: int) -> bytes:
    return b"PAYLOAD-%06d-" % i


def build(path: Path) -> Built:
    """A journal closed cleanly: 600 messages in 6 commits, 20 leased and 10 of them acked."""
    j = LmdbJournal(str(path))
    h = Harness()
    h.engine.add_queue(QueueSettings(name="jobs"))  # declared at run time, as `zq serve` does: its queue
    h.engine.add_queue(QueueSettings(name="reports"))  # recovers from the journal alone
    seqs: list[int] = []
    acked: list[int] = []
    for c in range(COMMITS):
        seqs += [h.engine.publish("jobs", marker(len(seqs) + i) + b"x" * 150, {"n": str(len(seqs) + i)}, h.now)
                 for i in range(PER_COMMIT)]
        if c == 2:
            h.sub("w", "jobs", 20)
        got = h.commit_to(j)
        if c == 2:
            acked = got["w"][:10]
            h.engine.ack("w", acked, h.now)
    h.engine.write_recovery_points()  # as the dispatcher does now and then: jobs from 11 on, reports from the end
    h.commit_to(j)
    end = j.next_seq()
    j.close()
    return Built(path, seqs, acked, end)


def flip(file: Path, offset: int, xor: int = 0xFF) -> None:
    with open(file, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ xor]))


def occurrences(file: Path, pattern: bytes) -> list[int]:
    """Every offset of ``pattern`` (the live copy and stale copies in freed pages)."""
    data = file.read_bytes()
    out, i = [], data.find(pattern)
    while i >= 0:
        out.append(i)
        i = data.find(pattern, i + 1)
    assert out, f"{pattern!r} is not in {file}"
    return out


def flip_everywhere(file: Path, pattern: bytes, at: int, xor: int = 0xFF) -> None:
    """Flip byte ``at`` of every copy of ``pattern``: the live one is damaged whichever it is."""
    for off in occurrences(file, pattern):
        flip(file, off + at, xor)


# How a stored record starts: its array header (how many fields), then its tag.
MESSAGE_HEAD = R.record_encoder.encode(R.Message(1, 0, "t", {}, b""))[:3]
EVENT_HEAD = R.record_encoder.encode(R.Event(1, 0, R.ACKED, "q", "c", [], []))[:3]


def message_key(seq: int) -> bytes:
    """A message's leaf node: its 8-byte key, then its record."""
    return seq.to_bytes(8, "big") + MESSAGE_HEAD


def event_key(seq: int) -> bytes:
    return seq.to_bytes(8, "big") + EVENT_HEAD


def meta(file: Path, n: int) -> dict:
    with open(file, "rb") as f:
        f.seek(n * PAGE)
        page = f.read(PAGE)
    last_pg, txnid = struct.unpack_from("<QQ", page, 136)
    return {"offset": n * PAGE, "txnid": txnid, "last_pg": last_pg, "main_root": struct.unpack_from("<Q", page, 128)[0]}


def current_meta(file: Path) -> dict:
    a, b = meta(file, 0), meta(file, 1)
    return b if b["txnid"] > a["txnid"] else a


def msgs_root(file: Path) -> tuple[int, int]:
    """The messages database's root page and depth (read from the main DB's leaf)."""
    m = current_meta(file)
    with open(file, "rb") as f:
        f.seek(m["main_root"] * PAGE)
        page = f.read(PAGE)
    i = page.find(b"msgs")
    assert i >= 0
    db = page[i + 4 : i + 4 + 48]
    depth = struct.unpack_from("<H", db, 6)[0]
    root = struct.unpack_from("<Q", db, 40)[0]
    return root, depth


def truncate(file: Path, size: int) -> None:
    os.truncate(file, size)


def leaf_pages_of(file: Path, i: int) -> list[int]:
    """The pages that hold message ``i``'s payload: its leaf, and stale copies of it in
    freed pages (damaging all of them damages the live one)."""
    return sorted({o // PAGE for o in occurrences(file, marker(i))})


def damage_pages(file: Path, pages: list[int], how: str) -> None:
    """``type``: the page's type byte says branch; ``zero``: the page is zeros."""
    with open(file, "r+b") as f:
        for pg in pages:
            if how == "zero":
                f.seek(pg * PAGE)
                f.write(b"\0" * PAGE)
            else:
                f.seek(pg * PAGE + 10)
                f.write(b"\x01")
