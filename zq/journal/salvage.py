"""Reading a damaged journal as far as it goes: every record checked, damaged pages
stepped over, what could not be read named (``Damage``). ``zq journal verify``,
``export`` and ``repair`` read through ``salvage``; a dispatcher whose recovery meets
damage refuses with ``damage_refusal`` (``recover``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import lmdb
import msgspec

from zq.core import records as R
from zq.core.engine import Engine
from zq.journal import integrity as I
from zq.journal.base import declared_name, recover_engine
from zq.journal.integrity import RESIDUE, JournalDamaged, ranges_text
from zq.journal.lmdb_journal import LmdbJournal, key, unkey
from zq.journal.pages import Snapshot, Tree

SCAN_CHUNK = 10_000  # records per read transaction
PROBES_MAX = 200  # LMDB lookups spent finding where readable records start again after a damaged page


def recover(journal: LmdbJournal, queues: Iterable[Any], *, auto_queues: bool = True) -> Engine:
    """``recover_engine`` over an LMDB journal; a damaged record, key or page refuses
    with one sentence naming every damaged bookmark and the ways out.

    The pages recovery will walk are checked first by plain reads (``check_pages``):
    LMDB aborts the process on some damaged pages instead of returning an error."""
    queues = list(queues)
    try:
        bad = check_pages(journal, None)  # the small tables, before they are read
        if not bad:
            rps = journal.recovery_points()
            names = {q.name for q in queues} | {declared_name(d) for d in journal.declared()}
            bad = check_pages(journal, min((rps.get(n, 0) for n in names), default=journal.high))
        if bad:
            raise JournalDamaged("; ".join(bad))
        return recover_engine(journal, queues, auto_queues=auto_queues)
    except (JournalDamaged, lmdb.Error, msgspec.MsgspecError) as exc:
        raise damage_refusal(journal, exc) from None


@dataclass
class Damage:
    """What a salvaging read could not take: records named one by one (a checksum, a
    key, a record that does not decode) and spans LMDB could not read (a damaged page)."""

    bookmarks: dict[str, set[int]] = field(default_factory=lambda: {"message": set(), "event": set()})
    spans: list[tuple[str, int, int | None, str]] = field(default_factory=list)  # kind, first, last (None: to the end), why
    keys: list[tuple[str, int, int]] = field(default_factory=list)  # kind, key, the bookmark its record says
    other: list[str] = field(default_factory=list)  # e.g. a run-time queue's declaration

    def __bool__(self) -> bool:
        return bool(self.bookmarks["message"] or self.bookmarks["event"] or self.spans or self.keys or self.other)

    def lost(self) -> list[int]:
        return sorted(self.bookmarks["message"] | self.bookmarks["event"])

    def sentences(self) -> list[str]:
        out = []
        for kind in ("message", "event"):
            if self.bookmarks[kind]:
                out.append(f"{kind} records damaged at bookmarks {ranges_text(self.bookmarks[kind])} (their "
                           "checksums do not match, or they do not decode)")
        for kind, stored_under, says in self.keys[:20]:
            out.append(f"the {kind} record of bookmark {says} is stored under key {stored_under} (a damaged key; "
                       "the record itself is intact)")
        for kind in ("message", "event"):
            spans = sorted((f, l) for k, f, l, _ in self.spans if k == kind)
            if not spans:
                continue
            whys = [w for k, _, _, w in self.spans if k == kind]
            if len(spans) == 1:
                first, last = spans[0]
                where = f"from bookmark {first} on" if last is None else f"between bookmarks {first} and {last}"
            else:
                where = f"at bookmarks {spans_text(spans)}"
            more = f"; {len(whys) - 1} more pages" if len(whys) > 1 else ""
            out.append(f"the {kind} records {where} cannot be read (a damaged LMDB page: {whys[0]}{more})")
        return out + self.other[:20]

    def summary(self) -> str:
        return "; ".join(self.sentences())

    def as_json(self) -> dict[str, Any]:
        return {kind + "s": ranges_text(seqs, most=100) for kind, seqs in self.bookmarks.items() if seqs} | (
            {"unreadable": [{"kind": k, "first": f, "last": l, "why": w} for k, f, l, w in self.spans[:100]]}
            if self.spans else {}) | (
            {"misplaced": [{"kind": k, "key": s, "bookmark": b} for k, s, b in self.keys[:100]]} if self.keys else {}) | (
            {"other": self.other[:100]} if self.other else {})


def spans_text(spans: list[tuple[int, int | None]], most: int = 20) -> str:
    """``210-285, 325-400, 593 on``: spans of bookmarks, those that touch merged."""
    merged: list[list[int | None]] = []
    for first, last in spans:
        prev = merged[-1] if merged else None
        if prev is not None and prev[1] is not None and first <= prev[1] + 1:  # type: ignore[operator]
            prev[1] = None if last is None else max(prev[1], last)  # type: ignore[type-var]
        else:
            merged.append([first, last])
    items = [f"{f} on" if l is None else str(f) if f == l else f"{f}-{l}" for f, l in merged]
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def salvage(j: LmdbJournal, kind: str, damage: Damage, from_seq: int = 0, to_seq: int | None = None,
            chunk: int = SCAN_CHUNK) -> Iterator[tuple[int, bytes]]:
    """Every sound record of ``kind`` ("message" / "event") in [from_seq, to_seq), as
    (bookmark, unsealed bytes), in key order; what cannot be taken goes to ``damage``.

    The table's pages are checked first (``zq.journal.pages``: a page LMDB would abort
    on is found by plain reads). A sound tree is read with LMDB's cursors; one with
    damaged pages is read by the page reader, which steps over them."""
    db = j.msgs if kind == "message" else j.events
    table_name = b"msgs" if kind == "message" else b"events"
    try:
        with Snapshot(j.env, j.path) as pages:
            table = pages.table(table_name)
            if table is None:
                return
            tree = pages.check(table, key(from_seq))
            if tree.bad:
                tree = Tree(table)
                last = from_seq - 1
                for k, v in pages.items(table, tree, key(from_seq)):
                    for seq_raw in checked(j, kind, damage, k, v, from_seq, to_seq, last):
                        last = seq_raw[0]
                        yield seq_raw
                    if to_seq is not None and len(k) == 8 and unkey(k) >= to_seq:
                        break
                for bad in tree.bad:
                    first = unkey(bad.low) if bad.low is not None and len(bad.low) == 8 else from_seq
                    last = unkey(bad.high) - 1 if bad.high is not None and len(bad.high) == 8 else None
                    damage.spans.append((kind, max(first, from_seq), last, bad.why))
                return
    except ValueError as exc:  # the main table itself (the tables' directory) cannot be read
        damage.other.append(f"the {kind} table cannot be found: {exc}")
        return
    pos = from_seq
    while True:
        batch: list[tuple[bytes, bytes]] = []
        error: lmdb.Error | None = None
        finished = True
        try:
            with j.env.begin(db=db) as txn, txn.cursor() as cur:
                if cur.set_range(key(pos)):
                    for k, v in cur.iternext():
                        batch.append((k, v))
                        if len(batch) >= chunk:
                            finished = False
                            break
        except lmdb.Error as exc:
            error = exc
        for k, v in batch:
            if to_seq is not None and len(k) == 8 and unkey(k) >= to_seq:
                return
            after = pos - 1
            if len(k) == 8 and unkey(k) >= pos:
                pos = unkey(k) + 1
            yield from checked(j, kind, damage, k, v, from_seq, to_seq, after)
        if error is not None:
            nxt = next_readable(j, db, pos)
            damage.spans.append((kind, pos, None if nxt is None else nxt - 1, str(error)))
            if nxt is None:
                return
            pos = nxt
            continue
        if finished:
            return


def checked(j: LmdbJournal, kind: str, damage: Damage, k: bytes, v: bytes, from_seq: int,
            to_seq: int | None, after: int = -1) -> Iterator[tuple[int, bytes]]:
    """One stored record, checked: (bookmark, unsealed bytes) if sound, else noted
    (``after``: the last bookmark read before it, to place a record whose key is damaged)."""
    if len(k) != 8:
        place = f"the {kind} record after bookmark {after}" if after >= 0 else f"a {kind} record"
        damage.other.append(f"{place} has a key of {len(k)} bytes (a damaged key)")
        return
    seq = unkey(k)
    sealed = seq >= j.sums_from
    if sealed and zlib.crc32(v) != RESIDUE:
        damage.bookmarks[kind].add(seq)
        return
    raw = v[:-I.SUM_BYTES] if sealed else v
    try:
        rec_seq = (R.message_decoder if kind == "message" else R.event_decoder).decode(raw).seq
    except msgspec.MsgspecError:
        damage.bookmarks[kind].add(seq)
        return
    if rec_seq != seq:
        damage.keys.append((kind, seq, rec_seq))
        if not sealed:  # nothing says which of the two is right
            return
        seq = rec_seq  # the record is sealed with its own bookmark: that one is right
        if to_seq is not None and seq >= to_seq or seq < from_seq:
            return
    yield seq, raw


def check_pages(j: LmdbJournal, start: int | None) -> list[str]:
    """Before LMDB's cursors walk the journal at a start: every page of the small
    tables (``start`` None), or of the records from ``start`` on, is what its parent
    says it is (``zq.journal.pages``). Returns what is not."""
    out = []
    tables = ((b"meta", b""), (b"queues", b"")) if start is None else ((b"msgs", key(start)), (b"events", key(start)))
    try:
        with Snapshot(j.env, j.path) as pages:
            for name, since in tables:
                table = pages.table(name)
                if table is None:
                    continue
                for bad in pages.check(table, since).bad[:20]:
                    out.append(f"page {bad.pgno} of the {name.decode()} table is damaged: {bad.why}")
    except ValueError as exc:
        out.append(f"the journal's tables cannot be found: {exc}")
    return out


def next_readable(j: LmdbJournal, db: Any, pos: int) -> int | None:
    """The first bookmark after ``pos`` from which LMDB can read again (stepping over
    damaged pages: an exponential search, then a binary one); None: none."""

    def reach(q: int) -> int | None | bool:  # the first key at or after q; None: none; False: unreadable
        try:
            with j.env.begin(db=db) as txn, txn.cursor() as cur:
                if not cur.set_range(key(q)):
                    return None
                cur.value()
                return unkey(cur.key())
        except lmdb.Error:
            return False

    lo, step, probes = pos, 1, 0  # lo: unreadable
    while True:
        q = pos + step
        probes += 1
        if q >= 1 << 64 or probes > PROBES_MAX:
            return None
        r = reach(q)
        if r is not False:
            break
        lo, step = q, step * 2
    hi = q  # reach(hi) is not False
    while hi - lo > 1 and probes < PROBES_MAX:
        mid = (lo + hi) // 2
        probes += 1
        if reach(mid) is False:
            lo = mid
        else:
            hi = mid
    r = reach(hi)
    return r if isinstance(r, int) and not isinstance(r, bool) else None


def survey(j: LmdbJournal, from_seq: int = 0) -> Damage:
    """Read every record from ``from_seq`` on: what is damaged."""
    damage = Damage()
    for kind in ("message", "event"):
        for _ in salvage(j, kind, damage, from_seq):
            pass
    return damage


def damage_refusal(j: LmdbJournal, first: BaseException) -> JournalDamaged:
    """The one sentence ``zq serve`` refuses a damaged journal with: every damaged
    bookmark named (a full survey: only on this path), and the ways out."""
    try:
        damage = survey(j)
        found = damage.summary()
        lost = damage.lost()
    except Exception as exc:  # noqa: BLE001 -- the survey itself failed: name what stopped recovery
        found, lost = f"{first} (and the survey of the rest failed: {exc})", []
    if not found:
        found = str(first)
    return JournalDamaged(
        f"journal {j.file} is damaged: {found}; nothing was served (`zq journal repair {j.path}` copies everything "
        f"else into a new journal and keeps the damaged file aside; `zq journal export --data {j.path} DIR` saves "
        "what can be read)", lost or getattr(first, "bookmarks", ()))


