"""Journal range reads for analytics (Spark executors), beside the dispatch loop.

Theory of operation
-------------------
A RANGE request asks for stored records of one kind (messages or events) between two
bookmarks, optionally of one topic (or a queue's topics, or a ``^regex``). Big ranges
are many megabytes: reading and encoding them inside the dispatch loop would stall
deliveries. So the loop only *forwards* RANGE frames, over an inproc PAIR socket, to
a reader thread; the thread reads committed records in short read transactions
(LMDB readers never block the writer), and sends the answer back the same way for
the loop to pass on. The loop's cost per request is two frame copies.

The answer (RECORDS) carries the records exactly as stored, as one msgpack array in
one binary field, plus each record's size: the executor parses every row of it at
once (``zq.columnar``). The dispatcher never decodes or re-encodes records unless a
topic filter needs the topic, and copies their bytes once, straight into the answer
frame (``records_frame``), which then travels to the ROUTER socket without a copy.
"""

from __future__ import annotations

import collections
import logging
import queue
import struct
import sys
import threading
from array import array
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate, islice

import msgspec
import zmq

from zq import wire
from zq.core import records as R
from zq.core.errors import LimitError
from zq.core.regex import compile_pattern

log = logging.getLogger("zq.ranges")

RANGE_RECORDS_MAX = 65_536
RANGE_BYTES_MAX = 16 * 1024 * 1024
RANGE_REQUESTS_MAX = 64  # RANGE requests queued for the reader thread at once (all peers)


def msgpack_array(raws: list[bytes]) -> bytes:
    """Stored records as one msgpack array (header + the records' bytes)."""
    return b"".join([_array_head(len(raws)), *raws])


def _array_head(n: int) -> bytes:
    return bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n) if n < 65536 else b"\xdd" + struct.pack(">I", n)


def array_header_size(n: int) -> int:
    """Bytes of the msgpack array header ``msgpack_array`` puts before ``n`` records."""
    return 1 if n < 16 else 3 if n < 65536 else 5


class RangeReader:
    """The reader thread; ``forward`` and ``answers`` are the loop's side."""

    def __init__(self, journal, ctx: zmq.Context, covers_of: Callable[[str], Callable[[str], bool] | None],  # type: ignore[no-untyped-def]
                 requests_max: int = RANGE_REQUESTS_MAX) -> None:
        self.journal = journal
        self.requests_max = requests_max
        self.covers_of = covers_of  # queue name -> its covers(), read on the loop thread
        self.endpoint = f"inproc://zq-ranges-{id(self)}"
        self.loop_side = ctx.socket(zmq.PAIR)
        self.loop_side.bind(self.endpoint)
        self.thread_side = ctx.socket(zmq.PAIR)
        self.thread_side.connect(self.endpoint)
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.pending: collections.deque[bytes] = collections.deque()  # requests not yet answered
        self.thread = threading.Thread(target=self.run, name="zq-ranges", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------ loop side

    def forward(self, peer_id: bytes, cmd: wire.Range) -> None:
        """Hand a RANGE to the reader thread; the queue's topics are resolved here.

        The request travels as an object through ``requests`` (a thread-safe queue),
        never pickled: a queue's topic matcher is a compiled pattern, which pickle
        cannot carry (that once ended the dispatcher)."""
        if len(self.pending) >= self.requests_max:
            raise LimitError(f"too many range requests waiting (max {self.requests_max}, "
                             "server.max_range_requests); retry shortly")
        covers = self.covers_of(cmd.target) if cmd.target else None
        self.pending.append(peer_id)
        self.requests.put((peer_id, cmd, covers))

    def answers(self) -> list[tuple[bytes, zmq.Frame]]:
        """Answers ready to send. The answer stays a ``zmq.Frame``: sending it on passes
        the reader thread's buffer along instead of copying megabytes twice."""
        out: list[tuple[bytes, zmq.Frame]] = []
        if not self.loop_side.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return out  # the common case, without raising zmq.Again
        while True:
            try:
                peer_id, frame = self.loop_side.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            if self.pending:
                self.pending.popleft()
            out.append((peer_id.bytes, frame))

    def close(self) -> None:
        self.requests.put(None)
        self.thread.join(10)
        self.loop_side.close(0)

    # ---------------------------------------------------------- thread side

    def run(self) -> None:
        sock = self.thread_side
        try:
            while True:
                item = self.requests.get()
                if item is None:
                    return
                peer_id, cmd, covers = item
                try:
                    frame = self.answer(cmd, covers)
                except Exception as exc:  # noqa: BLE001 -- any failure is the requester's error reply
                    log.warning("range request failed: %s", exc)
                    frame = wire.encode(wire.Error(cmd.req, "journal", f"range read failed: {exc}"))
                sock.send_multipart([peer_id, frame], copy=False)
        finally:
            sock.close(0)

    def answer(self, cmd: wire.Range, covers) -> bytes:  # type: ignore[no-untyped-def]
        """The encoded RECORDS (or ERROR) frame for one RANGE request."""
        if cmd.kind not in ("messages", "events"):
            return wire.encode(wire.Error(cmd.req, "protocol", f"kind must be messages or events, got {cmd.kind!r}"))
        match = self.topic_match(cmd.target, covers) if cmd.kind == "messages" else None
        queue = cmd.target if cmd.kind == "events" else None
        raws, nxt, done = select_records(self.journal, cmd.kind, cmd.start, cmd.end, match, queue, cmd.limit)
        return records_frame(cmd.req, cmd.kind, raws, nxt, done)

    @staticmethod
    def topic_match(target: str | None, covers) -> Callable[[str], bool] | None:  # type: ignore[no-untyped-def]
        if not target:
            return None
        if covers is not None:
            return covers
        if target.startswith("^"):
            pattern = compile_pattern(target)  # RE2: the reader thread holds the GIL while it matches
            return lambda topic: pattern.fullmatch(topic) is not None
        return target  # an exact topic: select_records compares encoded bytes


_KEY = struct.Struct(">Q")


def select_records(
    journal,  # type: ignore[no-untyped-def]
    kind: str,
    start: int,
    end: int | None,
    match: Callable[[str], bool] | str | None = None,
    queue: str | None = None,
    limit: int = RANGE_RECORDS_MAX,
) -> tuple[list[bytes], int, bool]:
    """The stored records of ``kind`` in [start, end), at most ``limit`` of them and
    about ``RANGE_BYTES_MAX`` bytes; the next bookmark to read from; whether the range
    is exhausted. One short read transaction.

    The hot path runs in C: ``islice`` pulls the values from the cursor (keys are not
    even materialised: every record starts with its own bookmark), the end bookmark is
    found by bisecting, which decodes only the probed records' seqs, and the byte
    limit by accumulating lengths. Only a topic or queue filter looks at records one
    by one.
    """
    db = journal.msgs if kind == "messages" else journal.events
    limit = max(1, min(limit, RANGE_RECORDS_MAX))
    with journal.env.begin(db=db) as txn, txn.cursor() as cur:
        raws = list(islice(cur.iternext(keys=False), limit)) if cur.set_range(_KEY.pack(max(start, 0))) else []
    exhausted = len(raws) < limit
    if end is not None and raws and record_seq(raws[-1]) >= end:
        raws = raws[: bisect_left(raws, end, key=record_seq)]
        exhausted = True
    if sum(map(len, raws)) > RANGE_BYTES_MAX:
        sizes = list(accumulate(map(len, raws)))
        raws = raws[: max(1, bisect_left(sizes, RANGE_BYTES_MAX))]
        exhausted = False
    nxt = record_seq(raws[-1]) + 1 if raws else start
    if isinstance(match, str):  # one exact topic: compare its encoded bytes in place
        enc, w = msgspec.msgpack.encode(match), _UINT_WIDTH
        raws = [v for v in raws if v.startswith(enc, 3 + (i := w[v[3]]) + w[v[3 + i]]) and v[1:3] == b"\xa1m"]
    elif match is not None:
        raws = [v for v in raws if match(record_topic(v))]
    elif queue:
        raws = [v for v in raws if R.event_decoder.decode(v).queue == queue]
    if exhausted and end is not None:
        nxt = max(nxt, end)
    return raws, nxt, exhausted


def record_sizes(raws: list[bytes]) -> bytes:
    """Each record's size as a little-endian uint32."""
    sizes = array("I", map(len, raws))
    if sys.byteorder == "big":
        sizes.byteswap()
    return sizes.tobytes()


def records_frame(req: int, kind: str, raws: list[bytes], nxt: int, done: bool) -> bytes:
    """``wire.encode(wire.Records(req, kind, msgpack_array(raws), nxt, done, sizes))``
    with the records copied once, not twice: the frame is joined from the encoded
    fields around the records' own bytes. (Tested against ``wire.encode``.)"""
    head = _array_head(len(raws))
    n = len(head) + sum(map(len, raws))
    bin_head = b"\xc4" + n.to_bytes(1, "big") if n < 256 else b"\xc5" + n.to_bytes(2, "big") if n < 65536 \
        else b"\xc6" + n.to_bytes(4, "big")
    front = msgspec.msgpack.encode(("records", req, kind))  # a 3-array: one header byte, dropped
    back = msgspec.msgpack.encode((nxt, done, record_sizes(raws)))
    return b"".join([b"\x97", front[1:], bin_head, head, *raws, back[1:]])


def record_seq(raw: bytes) -> int:
    """The bookmark of a stored record (message or event: ``[tag, seq, ...]``)."""
    w = _UINT_WIDTH[raw[3]]
    return raw[3] if w == 1 else int.from_bytes(raw[4 : 3 + w], "big")


# Width in bytes of a msgpack unsigned int by its first byte (fixint 1, uint8..64).
_UINT_WIDTH = [1] * 0x80 + [0] * 0x80
_UINT_WIDTH[0xCC], _UINT_WIDTH[0xCD], _UINT_WIDTH[0xCE], _UINT_WIDTH[0xCF] = 2, 3, 5, 9


def record_topic(raw: bytes) -> str:
    """The topic of a stored message record without decoding the rest of it.

    Layout (``records.Message``, array-like): array header, "m", seq, ts_ms, topic, ...
    """
    if raw[0] & 0xF0 != 0x90 or raw[1:3] != b"\xa1m":
        return R.message_decoder.decode(raw).topic  # not the compact layout: decode it all
    i = 3
    i += _UINT_WIDTH[raw[i]] or 0
    i += _UINT_WIDTH[raw[i]] or 0
    b = raw[i]
    if 0xA0 <= b <= 0xBF:
        n, i = b & 0x1F, i + 1
    elif b == 0xD9:
        n, i = raw[i + 1], i + 2
    elif b == 0xDA:
        n, i = int.from_bytes(raw[i + 1 : i + 3], "big"), i + 3
    else:
        return R.message_decoder.decode(raw).topic
    return raw[i : i + n].decode()


def decode_messages(blob: bytes | memoryview) -> list[R.Message]:
    return _MESSAGES.decode(blob)


def decode_events(blob: bytes | memoryview) -> list[R.Event]:
    return _EVENTS.decode(blob)


_MESSAGES = msgspec.msgpack.Decoder(list[R.Message])
_EVENTS = msgspec.msgpack.Decoder(list[R.Event])
