"""Journal replay: plain publish/subscribe from a bookmark, a time, the start or now.

Theory of operation
-------------------
A replay has no queue semantics: no leases, no acks that remove anything. Each one
is a *cursor* into the journal's messages plus a *window* (how many delivered
messages the client has not yet taken). Every loop iteration ``pump`` reads, for
each replay with room in its window, the next stored records after its cursor in
one short read transaction (``REPLAY_READ_MAX`` at most), keeps those of its topic
(or of its queue's topics) that pass its filter, and sends them as DELIVER frames
with the records embedded as stored.

"Live" needs no second path: a ``follow`` replay whose cursor reached the end of the
journal simply finds the records the next commit added. A replay without ``follow``
stops at the journal's end as it was when the replay began and says so with END.

The client returns window credit with ACK frames as the user takes messages, so a
slow reader holds at most ``window`` messages in flight and the dispatcher reads no
further ahead: a replay of a year of history never floods memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from zq import wire
from zq.core import limits
from zq.core import records as R
from zq.core.errors import LimitError, ProtocolError, ResumePointError
from zq.core.regex import PatternError, compile_pattern
from zq.core.expr import compile_filter
from zq.server.outflow import frames_of

REPLAY_READ_MAX = 2048  # records one replay reads per loop iteration
REPLAYS_PER_PEER_MAX = 64
REPLAYS_MAX = 1024  # open replays, all connections together
PUMP_READ_MAX = 16_384  # records all replays together read in one loop iteration (bounds the loop's time)
PUMP_BYTES_MAX = 4 * 1024 * 1024  # ... and bytes they send (six replays of 128 KiB records once held it 312 ms)
# ... and bytes they read: 2,048 records of 1 MiB were read (and checked) to send four of
# them, then read again the next iteration: one replay held the loop 3.4 s a turn.
PUMP_READ_BYTES_MAX = 8 * 1024 * 1024


@dataclass
class Replay:
    peer_id: bytes
    sub: str
    covers: Callable[[str], bool]
    match: Callable[[dict, bytes, str], bool] | None
    cursor: int  # next bookmark to read
    end: int | None  # stop before this bookmark (None: follow forever)
    window: int
    in_flight: int = 0
    sent: int = 0


class Replayer:
    """Every open replay of one server; the server feeds it commands and calls ``pump``."""

    def __init__(self, journal, engine_of: Callable[[], object], *,  # type: ignore[no-untyped-def]
                 per_peer_max: int = REPLAYS_PER_PEER_MAX, total_max: int = REPLAYS_MAX) -> None:
        self.journal = journal
        self.per_peer_max = per_peer_max
        self.total_max = total_max
        self.engine_of = engine_of
        self.replays: dict[str, Replay] = {}
        self.turn = 0

    def open(self, key: str, peer_id: bytes, cmd: wire.Replay) -> dict:
        if key in self.replays:
            raise ProtocolError(f"replay {cmd.sub!r} already open on this connection")
        if sum(1 for r in self.replays.values() if r.peer_id == peer_id) >= self.per_peer_max:
            raise LimitError(f"at most {self.per_peer_max} replays per connection (server.max_replays_per_connection)")
        if len(self.replays) >= self.total_max:
            raise LimitError(f"at most {self.total_max} replays open at once (server.max_replays)")
        engine = self.engine_of()
        q = engine.queues.get(cmd.target)  # type: ignore[attr-defined]
        if q is not None:
            covers = q.covers
        elif cmd.target.startswith("^"):
            try:
                pattern = compile_pattern(cmd.target)
            except PatternError as exc:
                raise ProtocolError(f"bad topic pattern {cmd.target[:80]!r}: {exc}") from None
            covers = lambda topic: pattern.fullmatch(topic) is not None  # noqa: E731
        else:
            covers = cmd.target.__eq__
        match = compile_filter(cmd.filter, engine.expr_limits).fn if cmd.filter else None  # type: ignore[attr-defined]
        next_seq = engine.next_seq  # type: ignore[attr-defined]
        if cmd.start_ms is not None:
            start = self.journal.seq_at_time(cmd.start_ms)
        elif cmd.start < 0:
            start = next_seq  # "now": only what is published from here on
        else:
            start = cmd.start
            if start > next_seq:
                raise ResumePointError(f"bookmark {start} is past this journal's end: it was never written here, or "
                                       f"a failover truncated it (a deposed leader's records the new one never had); "
                                       f"resume from {next_seq}")
        end = None if cmd.follow else next_seq
        if cmd.end is not None:
            end = cmd.end if end is None else min(end, cmd.end)
        window = max(1, min(cmd.window, limits.BACKLOG_MAX))
        self.replays[key] = Replay(peer_id, cmd.sub, covers, match, start, end, window)
        return {"start": start, "end": end}

    def close(self, key: str) -> bool:
        return self.replays.pop(key, None) is not None

    def drop_peer(self, peer_id: bytes) -> None:
        for key in [k for k, r in self.replays.items() if r.peer_id == peer_id]:
            del self.replays[key]

    def credit(self, key: str, n: int) -> bool:
        r = self.replays.get(key)
        if r is None:
            return False
        r.in_flight = max(0, r.in_flight - n)
        return True

    def next_seq_bound(self) -> int:
        return self.engine_of().next_seq  # type: ignore[attr-defined]

    def pump(self, send: Callable[[bytes, bytes], bool], not_reading: Callable[[bytes], bool] = lambda _: False) -> None:
        """Read and send what each replay has room for (called after the commit, when
        every record below the engine's ``next_seq`` is in the journal). A replay whose
        peer has not read what it was sent (``not_reading``) waits (zq.server.outflow)."""
        if not self.replays:
            return
        decode = R.message_decoder.decode
        journal_end = self.next_seq_bound()
        items = list(self.replays.items())
        self.turn = (self.turn + 1) % len(items)
        budget = PUMP_READ_MAX  # shared, starting at a different replay each time: none starves
        bytes_left = PUMP_BYTES_MAX
        read_left = PUMP_READ_BYTES_MAX
        for key, r in items[self.turn:] + items[: self.turn]:
            if r.end is not None and r.cursor >= r.end:  # from "now" or a future bookmark, without follow
                del self.replays[key]
                send(r.peer_id, wire.encode(wire.End(r.sub, r.sent)))
                continue
            room = r.window - r.in_flight
            stop = journal_end if r.end is None else min(r.end, journal_end)
            if room <= 0 or r.cursor >= stop:
                continue
            if not_reading(r.peer_id):
                continue
            if budget <= 0 or bytes_left <= 0 or read_left <= 0:
                break
            raws: list[msgspec.Raw] = []
            want = min(REPLAY_READ_MAX, max(room * 4, 64), budget)
            rows = self.journal.read_raw(r.cursor, want, read_left)
            budget -= max(len(rows), 1)
            read = sum(len(raw) for _, raw in rows)
            cut = read >= read_left  # stopped by the bytes: more may follow before the stop
            read_left -= read
            full = False
            for seq, raw in rows:
                if seq >= stop:
                    break
                r.cursor = seq + 1
                m = decode(raw)
                if not r.covers(m.topic):
                    continue
                if r.match is not None and not r.match(m.headers, m.payload, m.topic):
                    continue
                raws.append(msgspec.Raw(raw))
                bytes_left -= len(raw)
                if len(raws) >= room or bytes_left <= 0:
                    full = True  # (the rest is read next time, from the cursor)
                    break
            if not full and not cut and (len(rows) < want or (rows and rows[-1][0] >= stop)):
                r.cursor = stop  # read everything there is up to the stop
            n = len(raws)
            for part in frames_of(raws):
                if not send(r.peer_id, wire.encode(wire.DeliverRaw(r.sub, part, [0] * len(part)))):
                    self.replays.pop(key, None)  # the peer is gone (its drop_peer may have taken the replay already)
                    break
            else:
                r.in_flight += n
                r.sent += n
                if r.end is not None and r.cursor >= r.end:
                    del self.replays[key]
                    send(r.peer_id, wire.encode(wire.End(r.sub, r.sent)))

    def busy(self) -> bool:
        """Is there history some replay has room to read now (poll without waiting)?"""
        journal_end = self.next_seq_bound()
        for r in self.replays.values():
            stop = journal_end if r.end is None else min(r.end, journal_end)
            if r.in_flight < r.window and r.cursor < stop:
                return True
        return False

