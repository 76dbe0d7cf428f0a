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
once (``zq.spark.columnar``). The dispatcher never decodes or re-encodes records unless a
topic filter needs the topic, and copies their bytes once, straight into the answer
frame (``records_frame``), which then travels to the ROUTER socket without a copy.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable

import zmq

from zq import wire
from zq.core.errors import LimitError
from zq.core.regex import compile_pattern
from zq.journal.ranges import select_records
from zq.wire.records import records_frame

log = logging.getLogger("zq.ranges")

RANGE_REQUESTS_MAX = 64  # RANGE requests queued for the reader thread at once (all peers)


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
        if not self.pending:
            return out  # nothing asked, nothing to answer: no socket call (this runs every iteration)
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
    def topic_match(target: str | None, covers) -> Callable[[str], bool] | str | None:  # type: ignore[no-untyped-def]
        if not target:
            return None
        if covers is not None:
            return covers
        if target.startswith("^"):
            pattern = compile_pattern(target)  # RE2: the reader thread holds the GIL while it matches
            return lambda topic: pattern.fullmatch(topic) is not None
        return target  # an exact topic: select_records compares encoded bytes


