"""Operator tools over a journal directory, live or copied: info, verify, export,
and, with no server running, repair and reset.

The reading tools open the journal read-only and read in short transactions, so they
run safely beside a running server: LMDB readers never block its writer, and short
transactions never pin old pages for long.

A damaged journal (zq.journal.integrity) is read as far as it can be: ``salvage``
checks every record (checksum, bookmark against key, decoding) and steps over pages
LMDB cannot read, naming what it could not; ``verify`` reports it, ``export`` writes
everything else, ``repair`` copies everything else into a new journal.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from zq.core import records as R
from zq.core.errors import JournalError
from zq.core.settings import QueueSettings
from zq.journal import integrity as I
from zq.journal.base import declared_name, recover_engine
from zq.journal.integrity import JournalDamaged
from zq.journal.lmdb_journal import ID_KEY, NEXT_FLOOR_KEY, SUMS_FROM_KEY, LmdbJournal, key, take_writer_lock
from zq.journal.pages import Snapshot, Tree
from zq.journal.salvage import Damage, salvage


def open_readonly(path: str) -> LmdbJournal:
    if not os.path.exists(os.path.join(path, "data.mdb")) and I.read_mark(path) is None:
        raise JournalError(f"no journal at {path} (expected {path}/data.mdb)")
    return LmdbJournal(path, readonly=True)


def first_last(j: LmdbJournal, db: Any) -> tuple[int | None, int | None]:
    with j.env.begin(db=db) as txn, txn.cursor() as cur:
        first = int.from_bytes(cur.key(), "big") if cur.first() else None
        last = int.from_bytes(cur.key(), "big") if cur.last() else None
    return first, last


def info(path: str) -> dict[str, Any]:
    """Size, record counts, oldest and newest bookmarks, recovery points, queues."""
    j = open_readonly(path)
    try:
        with j.env.begin(db=j.meta) as txn:
            version = txn.get(b"format")
        first_msg, last_msg = first_last(j, j.msgs)
        first_ev, last_ev = first_last(j, j.events)
        out = {
            "path": path,
            "format": int(version) if version else None,
            "bytes": j.size_bytes(),
            "messages": j.counts()["messages"],
            "event_records": j.counts()["events"],  # one record covers one or more bookmarks (export: a row each)
            "oldest_message": first_msg,
            "newest_message": last_msg,
            "oldest_event": first_ev,
            "newest_event": last_ev,
            "recovery_points": j.recovery_points(),
            "declared_queues": sorted(declared_name(d) for d in j.declared()),
            "journal_id": j.id or None,
            "checksums_from": None if j.sums_from >= 1 << 64 else j.sums_from,
        }
        if j.mark is not None:
            out["mark"] = j.mark.next
        if j.mark_problem:
            out["problem"] = j.mark_problem
        return out
    except lmdb.Error as exc:
        raise j.damaged(exc) from None
    finally:
        j.close()


def verify(path: str, queues: Iterable[QueueSettings] = ()) -> dict[str, Any]:
    """Check every record (checksum, key, decoding), the directory's mark, and that the
    state rebuilds; ``ok`` is False with the problems listed and the damaged
    bookmarks named."""
    j = open_readonly(path)
    problems: list[str] = []
    counts = {"messages": 0, "event_records": 0, "event_rows": 0}  # rows: one per bookmark, as export writes them
    damage = Damage()
    try:
        if j.mark_problem:
            problems.append(j.mark_problem)
        messages: set[int] = set()
        events: list[R.Event] = []
        for kind, name in (("message", "messages"), ("event", "event_records")):
            previous = -1
            for seq, raw in salvage(j, kind, damage):
                if seq <= previous:
                    problems.append(f"{kind} record {seq} is out of order (after {previous})")
                previous = seq
                counts[name] += 1
                if kind == "event":
                    ev = R.event_decoder.decode(raw)
                    events.append(ev)
                    counts["event_rows"] += len(ev.bookmarks)
                else:
                    messages.add(seq)
        problems += damage.sentences()
        try:
            j.declared()
        except JournalError as exc:
            problems.append(str(exc))
        problems += check_bookmarks(messages, events)
        state: dict[str, Any] = {}
        if not damage:
            try:
                engine = recover_engine(j, list(queues))
                state = {name: {"depth": q.depth, "groups": len(q.groups)} for name, q in sorted(engine.queues.items())}
            except Exception as exc:  # noqa: BLE001 -- verify reports whatever stops the rebuild
                problems.append(f"state does not rebuild: {type(exc).__name__}: {exc}")
        else:
            problems.append(f"zq serve refuses this journal: `zq journal repair {path}` copies everything else into "
                            "a new journal")
        out = {"ok": not problems, "problems": problems[:100], "checked": counts, "queues": state}
        if damage:
            out["damaged"] = damage.as_json()
        return out
    except lmdb.Error as exc:
        raise j.damaged(exc) from None
    finally:
        j.close()


def check_bookmarks(messages: set[int], events: list[R.Event], report_max: int = 20) -> list[str]:
    """What two writers on one journal leave behind: one bookmark used by a message and
    an event, and events naming bookmarks that hold no message (the message a second
    writer confirmed and could not store). (From what ``salvage`` read: no LMDB cursor
    walks a journal that may be damaged.)"""
    problems: list[str] = []
    first_msg = min(messages) if messages else None
    for ev in events:
        if ev.seq in messages:
            problems.append(f"bookmark {ev.seq} is used by a message and by an event "
                            "(two processes wrote this journal?)")
        else:
            missing = [b for b in ev.bookmarks if first_msg is not None and b > first_msg and b not in messages]
            if missing:
                problems.append(f"event {ev.seq} ({ev.kind}, queue {ev.queue!r}) names bookmarks that hold "
                                f"no message: {missing[:5]}")
        if len(problems) >= report_max:
            break
    return problems


def message_row(m: R.Message) -> dict[str, Any]:
    row: dict[str, Any] = {"bookmark": m.seq, "ts_ms": m.ts_ms, "topic": m.topic, "headers": m.headers,
                           "msg_id": m.msg_id}
    try:
        row["data"] = m.payload.decode("utf-8")
    except UnicodeDecodeError:
        row["data"] = base64.b64encode(m.payload).decode()
        row["encoding"] = "base64"
    return row


def event_rows(e: R.Event) -> Iterator[dict[str, Any]]:
    """One row per bookmark: the journal batches events, analytics want them apart."""
    for seq, d in zip(e.bookmarks, e.deliveries):
        yield {"seq": e.seq, "ts_ms": e.ts_ms, "kind": e.kind, "queue": e.queue, "consumer": e.consumer,
               "bookmark": seq, "deliveries": d, "reason": e.reason, "consumer_name": e.consumer_name}


def export(path: str, out_dir: str, fmt: str = "jsonl", from_seq: int = 0, to_seq: int | None = None,
           progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Write messages and (exploded) events as ``messages.*`` and ``events.*`` in ``out_dir``.
    ``progress`` hears the number of records read so far, every 10,000 (a journal of
    millions takes a minute: the CLI shows a bar). A damaged journal is exported as
    far as it can be read: damaged records are left out and named (``damaged``)."""
    if fmt not in ("jsonl", "parquet"):
        raise JournalError(f"--format must be jsonl or parquet, got {fmt!r}")
    j = open_readonly(path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    damage = Damage()
    try:
        seen = [0]

        def counted(kind: str, decode: Callable[[bytes], Any]) -> Iterator[Any]:
            for _, raw in salvage(j, kind, damage, from_seq, to_seq):
                seen[0] += 1
                if progress is not None and seen[0] % 10_000 == 0:
                    progress(seen[0])
                yield decode(raw)

        messages = (message_row(m) for m in counted("message", R.message_decoder.decode))
        events = (row for e in counted("event", R.event_decoder.decode) for row in event_rows(e))
        if fmt == "jsonl":
            counts: dict[str, Any] = {"messages": write_jsonl(out / "messages.jsonl", messages),
                                      "event_rows": write_jsonl(out / "events.jsonl", events)}
        else:
            counts = {"messages": write_parquet(out / "messages.parquet", messages, MESSAGE_SCHEMA),
                      "event_rows": write_parquet(out / "events.parquet", events, EVENT_SCHEMA)}
        if progress is not None:
            progress(seen[0])
        if damage:
            counts["damaged"] = damage.as_json()
            counts["problem"] = f"journal {j.file}: {damage.summary()}; everything else is exported"
        return counts
    except lmdb.Error as exc:
        raise j.damaged(exc) from None
    finally:
        j.close()


# ------------------------------------------------------- repair and reset


def stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def set_aside(path: str, names: Iterable[str], prefix: str) -> str | None:
    """Move the files ``names`` of ``path`` that exist into a new ``path/prefix-<time>/``."""
    present = [n for n in names if os.path.lexists(os.path.join(path, n))]
    if not present:
        return None
    aside = os.path.join(path, f"{prefix}-{stamp()}")
    n = 1
    while os.path.exists(aside):
        n += 1
        aside = os.path.join(path, f"{prefix}-{stamp()}-{n}")
    os.makedirs(aside, mode=0o700)
    for name in present:
        os.replace(os.path.join(path, name), os.path.join(aside, name))
    return aside


def locked(path: str) -> int:
    if not os.path.isdir(path):
        raise JournalError(f"no journal directory at {path}")
    try:
        return take_writer_lock(path)
    except OSError as exc:
        raise JournalError(f"cannot lock the journal at {path}: {exc.strerror}") from None


def reset(path: str, keep: bool = False) -> dict[str, Any]:
    """Start a data directory anew, on purpose (no server may run on it).

    Without ``keep``: its journal files are moved aside into ``path/reset-<time>/``
    (nothing is deleted) and the next ``zq serve`` starts a new, empty journal. With
    ``keep``: the journal file stays and the directory's mark is made what it holds
    (a backup restored on purpose, or another node's copy); it never numbers below a
    bookmark the directory's old mark says was given out."""
    fd = locked(path)
    try:
        if not keep:
            aside = set_aside(path, (I.DATA_FILE, I.LOCK_MDB, I.ID_FILE), "reset")
            return {"path": path, "moved_aside": aside, "next": "zq serve starts a new, empty journal here"}
        if I.read_meta(path) is None:
            raise JournalError(f"--keep keeps {path}/{I.DATA_FILE}, but there is none to keep (or it is empty)")
        try:
            old = I.read_mark(path)
        except JournalDamaged:
            old = None
        try:
            os.remove(os.path.join(path, I.ID_FILE))
        except FileNotFoundError:
            pass
    finally:
        os.close(fd)
    j = LmdbJournal(path)  # no mark: it writes one from what the journal holds
    try:
        if old is not None and old.next > j.high:  # bookmarks given out before are not given out again
            with j.env.begin(write=True) as txn:
                txn.put(NEXT_FLOOR_KEY, key(old.next), db=j.meta)
            j.env.sync(True)
            j.synced(old.next, force=True)
        return {"path": path, "journal_id": j.id, "mark": j.high, "next": f"zq serve serves this journal (its next "
                f"bookmark {j.high})"}
    finally:
        j.close()


def repair(path: str) -> dict[str, Any]:
    """Copy every sound record of a damaged journal into a new one, in its place (no
    server may run on it): the damaged file is kept aside in ``path/damaged-<time>/``;
    the new journal keeps the old one's id and never numbers below a bookmark the old
    one gave out. Records that were damaged are gone (named in the result): a message
    is lost, an event's loss means at most a delivery made again."""
    fd = locked(path)
    tmp = os.path.join(path, "repair.tmp")
    file = os.path.join(path, I.DATA_FILE)
    truncated: I.Truncated | None = None
    try:
        try:
            I.read_meta(path)
        except I.Truncated as exc:
            # Read what is there: the missing pages read as zeros, which LMDB refuses as
            # pages (named as unreadable), and the file gets its own length back after.
            truncated = exc
            os.truncate(file, exc.needed)
        except JournalDamaged:
            pass  # said below, as the open meets it
        try:
            try:
                src = LmdbJournal(path, readonly=True)
            except JournalError as exc:
                raise JournalDamaged(f"cannot repair {path}: {exc}") from None
            damage = Damage()
            if truncated is not None:
                damage.other.append(f"the journal was truncated: {truncated.size} of {truncated.needed} bytes")
            try:
                target_next, kept = copy_sound(src, tmp, damage)
            finally:
                src.close()
        finally:
            if truncated is not None:
                os.truncate(file, truncated.size)  # the damaged file is kept as it was found
        aside = set_aside(path, (I.DATA_FILE, I.LOCK_MDB), "damaged")
        os.replace(os.path.join(tmp, I.DATA_FILE), os.path.join(path, I.DATA_FILE))
        dfd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        I.write_mark(path, I.Mark(kept.pop("id"), target_next))
        return {"path": path, "kept": kept, "damaged": damage.as_json(), "problems": damage.sentences(),
                "damaged_file": aside}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


def copy_sound(src: LmdbJournal, tmp: str, damage: Damage) -> tuple[int, dict[str, Any]]:
    """Write ``src``'s sound records into a new journal at ``tmp`` (synced). Returns its
    next bookmark and what it holds."""
    shutil.rmtree(tmp, ignore_errors=True)
    dst = LmdbJournal(tmp, durability="none")
    kept: dict[str, Any] = {"messages": 0, "events": 0, "queues": 0}
    try:
        top = 0
        with dst.env.begin(write=True) as txn:
            for kind, db in (("message", dst.msgs), ("event", dst.events)):
                rows = sorted({seq: raw for seq, raw in salvage(src, kind, damage)}.items())
                with txn.cursor(db=db) as cur:
                    cur.putmulti([(key(seq), I.seal(bytes(raw))) for seq, raw in rows], append=True)
                kept[kind + "s"] = len(rows)
                if rows:
                    top = max(top, rows[-1][0])
            for k, v in table_items(src, b"queues", damage):
                try:
                    txn.put(k, I.seal(bytes(src.open_table(k, v))), db=dst.queues)
                    kept["queues"] += 1
                except JournalDamaged as exc:
                    damage.other.append(str(exc))
            kept_ids = copy_ids(src, dst, txn)
            for k, v in table_items(src, b"meta", damage):
                if k not in (b"format", ID_KEY, SUMS_FROM_KEY):
                    txn.put(k, v, db=dst.meta)
            try:
                old_next = src.next_seq()
            except lmdb.Error:
                old_next = 0
            floor = max(old_next, src.mark.next if src.mark is not None else 0, top + 1)
            txn.put(NEXT_FLOOR_KEY, key(floor), db=dst.meta)  # never number below what the old journal gave out
            journal_id = src.id or dst.id
            txn.put(ID_KEY, journal_id.encode(), db=dst.meta)
        kept["ids"] = kept_ids
        kept["id"] = journal_id
        dst.env.sync(True)
        return floor, kept
    finally:
        dst.close()


def table_items(src: LmdbJournal, name: bytes, damage: Damage) -> list[tuple[bytes, bytes]]:
    """A small table's entries, read by the page reader (``zq.journal.pages``: no LMDB
    cursor walks a damaged journal); pages that cannot be read are named in ``damage``."""
    try:
        with Snapshot(src.env, src.path) as pages:
            table = pages.table(name)
            if table is None:
                return []
            tree = Tree(table)
            out = list(pages.items(table, tree))
    except ValueError as exc:
        damage.other.append(f"the {name.decode()} table cannot be read: {exc}")
        return []
    for bad in tree.bad:
        damage.other.append(f"some of the {name.decode()} table cannot be read: {bad.why}")
    return out


def copy_ids(src: LmdbJournal, dst: LmdbJournal, txn: lmdb.Transaction) -> int:
    """The message-id index, entries naming a bookmark the new journal holds; rebuilt
    from the messages if the old index cannot be read."""
    n = 0
    if src.ids is None or dst.ids is None:
        return n
    lost = Damage()
    entries = table_items(src, b"ids", lost)
    if lost:
        entries = []
        for seq, raw in salvage(src, "message", Damage()):
            m = R.message_decoder.decode(raw)
            if m.msg_id is not None and "zq.reason" not in m.headers:
                from zq.journal.lmdb_journal import _ID, id_key

                entries.append((id_key(m.topic, m.msg_id), _ID.pack(m.seq, m.ts_ms)))
    for k, v in entries:
        if len(v) == 16 and txn.get(key(int.from_bytes(v[:8], "big")), db=dst.msgs) is not None:
            if txn.put(k, v, db=dst.ids, overwrite=False):  # type: ignore[arg-type]
                n += 1
    return n


def write_jsonl(path: Path, rows: Iterable[dict]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False))
            f.write("\n")
            n += 1
    return n


MESSAGE_SCHEMA = [("bookmark", "int64"), ("ts_ms", "int64"), ("topic", "string"), ("headers", "map"),
                  ("msg_id", "string"), ("data", "string"), ("encoding", "string")]
EVENT_SCHEMA = [("seq", "int64"), ("ts_ms", "int64"), ("kind", "string"), ("queue", "string"), ("consumer", "string"),
                ("bookmark", "int64"), ("deliveries", "int64"), ("reason", "string"), ("consumer_name", "string")]


def write_parquet(path: Path, rows: Iterable[dict], schema: list[tuple[str, str]], chunk: int = 100_000) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise JournalError("parquet export needs pyarrow: pip install 'zq[spark]' (or pyarrow)") from None
    types = {"int64": pa.int64(), "string": pa.string(), "map": pa.map_(pa.string(), pa.string())}
    arrow_schema = pa.schema([(name, types[t]) for name, t in schema])
    n = 0
    with pq.ParquetWriter(str(path), arrow_schema) as writer:
        batch: list[dict] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= chunk:
                writer.write_table(pa.Table.from_pylist(batch, schema=arrow_schema))
                n += len(batch)
                batch = []
        if batch or n == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=arrow_schema))
            n += len(batch)
    return n
