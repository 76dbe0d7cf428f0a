"""Operator tools over a journal directory, live or copied: info, verify, export.

They open the journal read-only and read in short transactions (``scan``), so they
run safely beside a running server: LMDB readers never block its writer, and short
transactions never pin old pages for long.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from zq.core import records as R
from zq.core.errors import JournalError
from zq.core.settings import QueueSettings
from zq.journal.base import declared_name, recover_engine
from zq.journal.lmdb_journal import LmdbJournal


def open_readonly(path: str) -> LmdbJournal:
    if not os.path.exists(os.path.join(path, "data.mdb")):
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
        return {
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
        }
    finally:
        j.env.close()


def verify(path: str, queues: Iterable[QueueSettings] = ()) -> dict[str, Any]:
    """Decode every record and rebuild the state; ``ok`` is False with the problems listed."""
    j = open_readonly(path)
    problems: list[str] = []
    counts = {"messages": 0, "event_records": 0, "event_rows": 0}  # rows: one per bookmark, as export writes them
    try:
        for name, db, decoder in (("messages", j.msgs, R.message_decoder), ("event_records", j.events, R.event_decoder)):
            previous = 0
            with j.env.begin(db=db) as txn:
                for k, v in txn.cursor():
                    seq = int.from_bytes(k, "big")
                    try:
                        rec = decoder.decode(v)
                    except msgspec.MsgspecError as exc:
                        problems.append(f"{name} record {seq} does not decode: {exc}")
                        continue
                    if rec.seq != seq:
                        problems.append(f"{name} record under key {seq} says it is {rec.seq}")
                    if seq <= previous:
                        problems.append(f"{name} key {seq} out of order")
                    previous = seq
                    counts[name] += 1
                    if name == "event_records":
                        counts["event_rows"] += len(rec.bookmarks)
                    if len(problems) > 100:
                        break
        problems += check_bookmarks(j)
        state: dict[str, Any] = {}
        try:
            engine = recover_engine(j, list(queues))
            state = {name: {"depth": q.depth, "groups": len(q.groups)} for name, q in sorted(engine.queues.items())}
        except Exception as exc:  # noqa: BLE001 -- verify reports whatever stops the rebuild
            problems.append(f"state does not rebuild: {type(exc).__name__}: {exc}")
        return {"ok": not problems, "problems": problems[:100], "checked": counts, "queues": state}
    finally:
        j.env.close()


def check_bookmarks(j: LmdbJournal, report_max: int = 20) -> list[str]:
    """What two writers on one journal leave behind: one bookmark used by a message and
    an event, and events naming bookmarks that hold no message (the message a second
    writer confirmed and could not store)."""
    problems: list[str] = []
    with j.env.begin() as txn:
        msg_keys = set(txn.cursor(db=j.msgs).iternext(keys=True, values=False))
        first_msg = min(msg_keys) if msg_keys else None
        for k, v in txn.cursor(db=j.events):
            if k in msg_keys:
                problems.append(f"bookmark {int.from_bytes(k, 'big')} is used by a message and by an event "
                                "(two processes wrote this journal?)")
            else:
                ev = R.event_decoder.decode(v)
                missing = [b for b in ev.bookmarks
                           if first_msg is not None and b.to_bytes(8, "big") > first_msg
                           and b.to_bytes(8, "big") not in msg_keys]
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
           progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Write messages and (exploded) events as ``messages.*`` and ``events.*`` in ``out_dir``.
    ``progress`` hears the number of records read so far, every 10,000 (a journal of
    millions takes a minute: the CLI shows a bar)."""
    if fmt not in ("jsonl", "parquet"):
        raise JournalError(f"--format must be jsonl or parquet, got {fmt!r}")
    j = open_readonly(path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        seen = [0]

        def counted(records: Iterable[Any]) -> Iterator[Any]:
            for rec in records:
                seen[0] += 1
                if progress is not None and seen[0] % 10_000 == 0:
                    progress(seen[0])
                yield rec

        messages = (message_row(m) for m in counted(j.read_messages(from_seq, to_seq)))
        events = (row for e in counted(j.read_events(from_seq, to_seq)) for row in event_rows(e))
        if fmt == "jsonl":
            counts = {"messages": write_jsonl(out / "messages.jsonl", messages),
                      "event_rows": write_jsonl(out / "events.jsonl", events)}
        else:
            counts = {"messages": write_parquet(out / "messages.parquet", messages, MESSAGE_SCHEMA),
                      "event_rows": write_parquet(out / "events.parquet", events, EVENT_SCHEMA)}
        if progress is not None:
            progress(seen[0])
        return counts
    finally:
        j.env.close()


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
