"""A PySpark data source for zq: ``spark.read.format("zq")``, ``readStream``,
``df.write`` and ``writeStream`` (``pip install 'zq[spark]'``).

Theory of operation
-------------------
*Reading.* The planner asks the dispatcher where the journal ends (BOUNDS) and cuts
[from, to) into bookmark ranges, one ``InputPartition`` each. Every executor fetches
its range with RANGE requests over ZeroMQ (``zq.server.ranges``: the dispatcher answers from
a reader thread, so a big read never stalls deliveries), decodes each answer's records
with one typed msgspec call and builds one Arrow ``RecordBatch`` per answer against a
fixed schema. With ``option("path", DIR)`` executors read a (copied) journal
directory themselves, for audits; no dispatcher is involved.

*Streaming.* Offsets are ``{"bookmark": n}``: the next bookmark to read. A micro-batch
is [start, end) with ``end`` at most the journal's committed end, so a restart from
the checkpoint re-reads exactly the batch it had not committed: no gaps, no
duplicates. ``maxBookmarksPerBatch`` bounds a batch (bookmarks, not rows: events and
other topics share the numbering).

*Writing.* Each row becomes a message; a task publishes its rows in frames of up to
4,096 and waits for every confirmation before it reports success. Every message
carries an id: the ``msg_id`` column when present, otherwise one derived from the
row's content (and its occurrence in the partition), so a retried task publishes
nothing twice: the dispatcher's dedup answers with the first bookmarks. ``overwrite``
is refused: a journal is append-only.

Pitfalls from ``shared/SPARK-NOTES.md`` handled here: Arrow schema matched exactly
(``timestamp[us, UTC]``, ``binary``, nullable, declared order); pyarrow imported
eagerly so a missing install fails clearly; no reliance on ``commit()``/``stop()``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import accumulate, chain
from operator import attrgetter
from typing import Any

try:
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

    from zq.spark.columnar import MessageColumns, Unparsed  # numpy
except ImportError as exc:  # pragma: no cover - exercised by users without the extra
    raise ImportError(f"zq.spark needs pyspark, pyarrow and numpy: pip install 'zq[spark]' ({exc})") from exc

from zq.core import records as R
from zq.core.errors import ProtocolError
from zq.wire.records import decode_events, decode_messages

MESSAGE_DDL = ("bookmark BIGINT, topic STRING, timestamp TIMESTAMP, msg_id STRING, `group` STRING, priority BIGINT, "
               "headers MAP<STRING, STRING>, payload BINARY")
EVENT_DDL = ("time TIMESTAMP, queue STRING, bookmark BIGINT, kind STRING, consumer STRING, deliveries INT, reason STRING, "
             "event_seq BIGINT, consumer_name STRING")
UTC_US = pa.timestamp("us", tz="UTC")
# Records per RANGE answer. Measured (bench/spark.py, 1M rows, local[2]): 16,384 (about
# 2.5 MB at 128 B) reads faster than 65,536, because each answer's few copies then stay
# in the CPU caches.
BATCH_ROWS = 16_384
MESSAGE_SCHEMA = pa.schema([
    ("bookmark", pa.int64()), ("topic", pa.string()), ("timestamp", UTC_US), ("msg_id", pa.string()),
    ("group", pa.string()), ("priority", pa.int64()), ("headers", pa.map_(pa.string(), pa.string())),
    ("payload", pa.binary()),
])
EVENT_SCHEMA = pa.schema([
    ("time", UTC_US), ("queue", pa.string()), ("bookmark", pa.int64()), ("kind", pa.string()), ("consumer", pa.string()),
    ("deliveries", pa.int32()), ("reason", pa.string()), ("event_seq", pa.int64()), ("consumer_name", pa.string()),
])


# ------------------------------------------------------------------ options


@dataclass
class Options:
    endpoint: str | None
    path: str | None
    kind: str  # "messages" or "events"
    target: str | None  # topic / queue / ^regex for messages; a queue (or None: all) for events
    start: int | None
    start_ms: int | None
    end: int | None
    end_ms: int | None
    partitions: int
    group_header: str
    batch_rows: int
    max_bookmarks: int | None
    by_queue: bool = False  # target names a queue (its topics are the dispatcher's to match)

    @classmethod
    def parse(cls, options: dict[str, str]) -> "Options":
        o = {k.lower(): v for k, v in options.items()}
        endpoint, path = o.get("endpoint"), o.get("path")
        if not endpoint and not path:
            raise ProtocolError("zq data source: set option 'endpoint' (a dispatcher) or 'path' (a journal directory)")
        named = [k for k in ("topic", "queue", "events") if k in o]
        if len(named) > 1:
            raise ProtocolError(f"zq data source: give one of topic, queue, events (got {named})")
        kind = "events" if "events" in o else "messages"
        target = o.get("topic") or o.get("queue") or (o.get("events") if o.get("events") not in (None, "", "*", "true") else None)
        start, start_ms = bookmark_or_time(o.get("from"))
        end, end_ms = bookmark_or_time(o.get("to"))
        max_b = o.get("maxbookmarksperbatch")
        if "queue" in o and path:
            raise ProtocolError("zq data source: option 'queue' needs the dispatcher ('endpoint'); with 'path' use 'topic'")
        return cls(endpoint, path, kind, target, start, start_ms, end, end_ms, int(o.get("partitions", "2")),
                   o.get("group_header", "group"), int(o.get("batch_rows", str(BATCH_ROWS))), int(max_b) if max_b else None,
                   by_queue="queue" in o)

    @property
    def schema(self) -> pa.Schema:
        return EVENT_SCHEMA if self.kind == "events" else MESSAGE_SCHEMA


def bookmark_or_time(text: str | None) -> tuple[int | None, int | None]:
    """``from`` / ``to``: a bookmark (digits) or a time (ISO 8601, UTC if no zone)."""
    if text is None or text == "":
        return None, None
    if text.isdigit():
        return int(text), None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ProtocolError(f"zq data source: from/to must be a bookmark or an ISO time, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return None, int(when.timestamp() * 1000)


# ------------------------------------------------------------ journal access


class Journal:
    """One executor's (or the planner's) way to the journal: a dispatcher or a directory."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.client = None
        self.local = None
        if opts.path:
            from zq.journal.lmdb_journal import LmdbJournal

            self.local = LmdbJournal(opts.path, readonly=True)
        else:
            from zq.client import Client

            self.client = Client(opts.endpoint, name="zq-spark", connect_timeout=30)  # type: ignore[arg-type]

    def end(self) -> int:
        if self.client is not None:
            return self.client.bounds()["next_seq"]
        return self.local.next_seq()  # type: ignore[union-attr]

    def seq_at(self, ms: int) -> int:
        if self.client is not None:
            return self.client.bounds(at_ms=ms)["seq_at"]
        return self.local.seq_at_time(ms)  # type: ignore[union-attr]

    def resolve(self, bookmark: int | None, ms: int | None, default: int) -> int:
        if bookmark is not None:
            return bookmark
        if ms is not None:
            return self.seq_at(ms)
        return default

    def read(self, start: int, end: int) -> tuple[pa.RecordBatch, int, bool]:
        """An Arrow batch of [start, end): up to ``batch_rows`` records read, then filtered.

        An exact topic or a ^regex is matched here, on the executors, on the topic column
        (it costs them little, and keeps the dispatcher's single reader thread to bulk
        reads); a queue's topics are known to the dispatcher only, so it matches those.
        """
        o = self.opts
        server_target = o.target
        if o.kind == "messages" and o.target and not o.by_queue:
            server_target = None
        if self.client is not None:
            r = self.client.read_range(o.kind, start, end, server_target, o.batch_rows)
            blob, sizes, nxt, done = r.blob, r.sizes, r.next, r.done
        else:
            from zq.wire.records import msgpack_array, record_sizes
            from zq.journal.ranges import select_records

            raws, nxt, done = select_records(self.local, o.kind, start, end, None,
                                             o.target if o.kind == "events" else None, o.batch_rows)
            blob, sizes = msgpack_array(raws), record_sizes(raws)
        if o.kind == "events":
            return events_batch(decode_events(blob)), nxt, done
        batch = messages_batch(blob, sizes, o.group_header)
        if server_target is None and o.target:
            batch = batch.filter(topic_mask(batch.column(1), o.target))
        return batch, nxt, done

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.local is not None:
            self.local.env.close()


def batches(opts: Options, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """Arrow batches of [start, end), one per answer."""
    j = Journal(opts)
    try:
        while start < end:
            batch, nxt, done = j.read(start, end)
            if batch.num_rows:
                yield batch
            if done or nxt <= start:
                break
            start = nxt
    finally:
        j.close()


def topic_mask(topics: pa.Array, target: str) -> pa.Array:
    """Rows whose topic is ``target`` (or fully matches it, for a ``^regex``). A regex is
    run by Python's ``re`` on the distinct topics only, so it means what it means
    everywhere else in zq."""
    if not target.startswith("^"):
        return pc.equal(topics, target)
    pattern = re.compile(target)
    matching = [t for t in pc.unique(topics).to_pylist() if pattern.fullmatch(t) is not None]
    return pc.is_in(topics, value_set=pa.array(matching, pa.string()))


def to_int(text: str | None) -> int | None:
    """A header as the int64 column holds it: NULL when missing, not a number, or out
    of int64's range (a publisher may write any string; one must not fail the job)."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if -(1 << 63) <= value < 1 << 63 else None


def messages_batch(blob: bytes | memoryview, sizes: bytes, group_header: str = "group") -> pa.RecordBatch:
    """One answer's records as Arrow columns: parsed all at once (``zq.spark.columnar``), or,
    if a record is not in the layout that reads, decoded one by one."""
    if sizes:
        try:
            cols = MessageColumns(blob, sizes)
        except Unparsed:
            pass
        else:
            return pa.RecordBatch.from_arrays([
                cols.bookmarks(), cols.topics(), cols.timestamps_us(UTC_US), cols.msg_ids(),
                cols.string_header(group_header), cols.int_header("priority", to_int),
                cols.headers(MESSAGE_SCHEMA.field("headers").type), cols.payloads(),
            ], schema=MESSAGE_SCHEMA)
    return decoded_messages_batch(decode_messages(blob), group_header)


def decoded_messages_batch(ms: list[R.Message], group_header: str = "group") -> pa.RecordBatch:
    """Columns built with ``map`` / ``chain`` (C loops) from decoded records."""
    n = len(ms)
    hs = list(map(_HEADERS, ms))
    lengths = list(map(len, hs))
    offsets = list(accumulate(lengths, initial=0))
    if offsets[-1]:
        keys = list(chain.from_iterable(hs))
        values = list(chain.from_iterable(map(dict.values, hs)))
        group = pa.array([h.get(group_header) for h in hs], pa.string())
        priority = pa.array([to_int(h.get("priority")) for h in hs], pa.int64())
    else:
        keys, values = [], []
        group, priority = pa.nulls(n, pa.string()), pa.nulls(n, pa.int64())
    headers = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                      pa.array(values, pa.string()))
    return pa.RecordBatch.from_arrays([
        pa.array(list(map(_SEQ, ms)), pa.int64()),
        pa.array(list(map(_TOPIC, ms)), pa.string()),
        pc.multiply(pa.array(list(map(_TS, ms)), pa.int64()), 1000).cast(UTC_US),
        pa.array(list(map(_MSG_ID, ms)), pa.string()),
        group,
        priority,
        headers,
        pa.array(list(map(_PAYLOAD, ms)), pa.binary()),
    ], schema=MESSAGE_SCHEMA)


_SEQ, _TS, _TOPIC, _HEADERS, _PAYLOAD, _MSG_ID = (attrgetter(a) for a in ("seq", "ts_ms", "topic", "headers", "payload", "msg_id"))


def event_rows(evs: list[R.Event]) -> dict[str, list]:
    cols: dict[str, list] = {name: [] for name in EVENT_SCHEMA.names}
    for e in evs:
        n = len(e.bookmarks)
        cols["time"] += [e.ts_ms * 1000] * n
        cols["queue"] += [e.queue] * n
        cols["bookmark"] += e.bookmarks
        cols["kind"] += [e.kind] * n
        cols["consumer"] += [e.consumer or None] * n
        cols["deliveries"] += e.deliveries
        cols["reason"] += [e.reason or None] * n
        cols["event_seq"] += [e.seq] * n
        cols["consumer_name"] += [e.consumer_name or None] * n
    return cols


def events_batch(evs: list[R.Event]) -> pa.RecordBatch:
    cols = event_rows(evs)
    arrays = [pa.array(cols["time"], pa.int64()).cast(UTC_US)]
    arrays += [pa.array(cols[f.name], f.type) for f in list(EVENT_SCHEMA)[1:]]
    return pa.RecordBatch.from_arrays(arrays, schema=EVENT_SCHEMA)


# ------------------------------------------------------------------ sources


@dataclass
class Span(InputPartition):
    start: int
    end: int


def split(start: int, end: int, parts: int) -> list[Span]:
    if end <= start:
        return [Span(start, start)]
    parts = max(1, min(parts, end - start))
    step = -(-(end - start) // parts)
    return [Span(s, min(s + step, end)) for s in range(start, end, step)]


class ZqDataSource(DataSource):
    """``format("zq")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return "zq"

    def schema(self) -> str:
        return EVENT_DDL if Options.parse(self.options).kind == "events" else MESSAGE_DDL

    def reader(self, schema: Any) -> "ZqReader":
        return ZqReader(Options.parse(self.options))

    def streamReader(self, schema: Any) -> "ZqStreamReader":
        return ZqStreamReader(Options.parse(self.options))

    def writer(self, schema: Any, overwrite: bool) -> "ZqWriter":
        return ZqWriter(self.options, overwrite)

    def streamWriter(self, schema: Any, overwrite: bool) -> "ZqStreamWriter":
        return ZqStreamWriter(self.options, overwrite)


class ZqReader(DataSourceReader):
    def __init__(self, opts: Options) -> None:
        self.opts = opts

    def partitions(self) -> list[Span]:
        j = Journal(self.opts)
        try:
            end = j.end()
            start = j.resolve(self.opts.start, self.opts.start_ms, 0)
            stop = min(end, j.resolve(self.opts.end, self.opts.end_ms, end))
        finally:
            j.close()
        return split(start, stop, self.opts.partitions)

    def read(self, partition: Span) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        yield from batches(self.opts, partition.start, partition.end)


class ZqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"bookmark": n}``; see the module docstring."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.available_now: int | None = None

    def initialOffset(self) -> dict:
        j = Journal(self.opts)
        try:
            return {"bookmark": j.resolve(self.opts.start, self.opts.start_ms, 0)}
        finally:
            j.close()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_bookmarks) if self.opts.max_bookmarks else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        j = Journal(self.opts)
        try:
            self.available_now = j.end()
        finally:
            j.close()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        j = Journal(self.opts)
        try:
            end = j.end()
        finally:
            j.close()
        if self.available_now is not None:
            end = min(end, self.available_now)
        if self.opts.end is not None:
            end = min(end, self.opts.end)
        begin = start["bookmark"]
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {"bookmark": max(begin, end)}

    def partitions(self, start: dict, end: dict) -> list[Span]:
        return split(start["bookmark"], end["bookmark"], self.opts.partitions)

    def read(self, partition: Span) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        yield from batches(self.opts, partition.start, partition.end)

    def commit(self, end: dict) -> None:
        pass  # advisory only (SPARK-NOTES: the last commit may never come)


# ------------------------------------------------------------------ writers


@dataclass
class Published(WriterCommitMessage):
    partition: int
    attempt: int
    messages: int


class WriteOptions:
    def __init__(self, options: dict[str, str], overwrite: bool) -> None:
        if overwrite:
            raise ProtocolError("zq data source: a journal is append-only; mode('overwrite') is refused (use 'append')")
        o = {k.lower(): v for k, v in options.items()}
        self.endpoint = o.get("endpoint")
        self.topic = o.get("topic")
        if not self.endpoint or not self.topic:
            raise ProtocolError("zq data source: writing needs options 'endpoint' and 'topic'")
        self.group_header = o.get("group_header", "group")


def derived_ids(rows: list[dict], seen: dict[str, int], partition: int = 0) -> list[str]:
    """A message id per row from its content, its task's partition and ``k`` for its
    k-th repeat in the task (``seen`` counts across the task's batches): a retried task
    derives the same ids, and equal rows in different partitions stay distinct."""
    out = []
    for row in rows:
        h = hashlib.blake2b(digest_size=16)
        h.update(row["payload"] or b"")
        raw = row.get("headers") or {}
        h.update(json.dumps(sorted(raw.items() if isinstance(raw, dict) else raw)).encode())
        h.update(str(row.get("group")).encode())
        h.update(str(row.get("priority")).encode())
        digest = h.hexdigest()
        k = seen.get(digest, 0)
        seen[digest] = k + 1
        out.append(f"spark:{digest}#{partition}.{k}")
    return out


def publish_batches(opts: WriteOptions, iterator: Iterator[pa.RecordBatch]) -> int:
    """Publish every row as its batch arrives; returns once each one is confirmed.

    A task that fails halfway has published what it published (Spark has no rollback);
    its retry derives the same ids, and the dispatcher's dedup absorbs the repeats.
    """
    from zq.client import Client

    seen: dict[str, int] = {}
    partition = task_context()[0]
    sent = 0
    with Client(opts.endpoint, name="zq-spark-writer", connect_timeout=30) as c:  # type: ignore[arg-type]
        pending: list = []
        for batch in iterator:
            rows = batch.to_pylist()
            if not rows:
                continue
            if "payload" not in rows[0]:
                raise ProtocolError("zq data source: the DataFrame needs a 'payload' column (binary or string)")
            ids = [r.get("msg_id") for r in rows] if "msg_id" in rows[0] else derived_ids(rows, seen, partition)
            missing = [k for k, i in enumerate(ids) if i is None]
            if missing:  # a null msg_id (a copy of messages published without one): derive it
                for k, derived in zip(missing, derived_ids([rows[k] for k in missing], seen, partition)):
                    ids[k] = derived
            pending += c.publish_records_async(opts.topic, [message_of(opts, row, msg_id) for row, msg_id in zip(rows, ids)])
            sent += len(rows)
            while len(pending) > 8:  # a bounded window of unconfirmed frames
                pending.pop(0).result(300)
        for f in pending:
            f.result(300)
    return sent


def message_of(opts: WriteOptions, row: dict, msg_id: object) -> tuple[bytes, dict[str, str], str]:
    payload = row["payload"]
    payload = payload.encode() if isinstance(payload, str) else bytes(payload or b"")
    raw = row.get("headers") or {}
    pairs = raw.items() if isinstance(raw, dict) else raw  # Arrow gives a map as (key, value) pairs
    headers = {k: v for k, v in pairs if v is not None}
    if row.get("group") is not None:
        headers[opts.group_header] = str(row["group"])
    if row.get("priority") is not None:
        headers["priority"] = str(row["priority"])
    msg_id = str(msg_id)
    if msg_id.startswith("zq:"):  # a copy of a transaction's output: the zq: ids are the dispatcher's alone
        msg_id = "spark:" + msg_id  # (the same row maps to the same id: a retried task still publishes it once)
    return payload, headers, msg_id


def task_context() -> tuple[int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return (ctx.partitionId(), ctx.attemptNumber()) if ctx is not None else (0, 0)


class PublishingWriter:
    """What both writers do: publish the task's rows (``publish_batches``)."""

    def __init__(self, options: dict[str, str], overwrite: bool) -> None:
        self.opts = WriteOptions(options, overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        n = publish_batches(self.opts, iterator)
        partition, attempt = task_context()
        return Published(partition, attempt, n)


class ZqWriter(PublishingWriter, DataSourceArrowWriter):
    pass


class ZqStreamWriter(PublishingWriter, DataSourceStreamArrowWriter):
    def commit(self, messages: list, batchId: int) -> None:
        pass

    def abort(self, messages: list, batchId: int) -> None:
        pass


def register(spark: Any) -> None:
    """``spark.dataSource.register(ZqDataSource)``."""
    spark.dataSource.register(ZqDataSource)


QUIET_LOG4J = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = error
"""


def local_session(app: str = "zq", cores: int = 2, extra: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """A quiet, loopback-only local Spark session with zq registered (the settings
    measured in SPARK-NOTES: one shuffle partition per core, UTC, no UI)."""
    import os
    import sys
    import tempfile

    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    log4j = os.path.join(tempfile.gettempdir(), "zq-log4j2-quiet.properties")
    with open(log4j, "w") as f:
        f.write(QUIET_LOG4J)
    builder = (
        SparkSession.builder.master(f"local[{cores}]").appName(app)
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores)).config("spark.default.parallelism", str(cores))
        .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "2g")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile=file:{log4j}")
    )
    for k, v in (extra or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def now_ms() -> int:
    return int(time.time() * 1000)
