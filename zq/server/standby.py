"""A standby: a second machine's copy of a dispatcher's journal, kept by pulling.

Theory of operation
-------------------
The standby is a client of the leader (a DEALER) and the only writer of its own LMDB
journal. Each round it sends BOUNDS with its position (every record below it is synced
here: what replicated confirmations wait for), which the leader answers as soon as its
journal passes that position, or its small tables change, or a second passes; then
RANGE for the messages and the events from the position, both at once (the leader's
reader thread answers: the dispatch loop only forwards the frames, so a standby
catching up does not stall deliveries); then, only when they changed, the small tables
(ADMIN ``journal-tables``: run-time queues, recovery points, where retention has
deleted up to); and stores the batch with ``zq.journal.replica.apply``: the records'
own bytes, one transaction, synced. Messages and events share one bookmark sequence,
dense (each bookmark is one or the other); a batch covers a window of bookmarks both
answers cover entirely, so the position only ever moves past records the standby holds,
and a window with fewer records than bookmarks means the leader's retention deleted
some before they were copied.

A standby is promoted by hand: stop it, start ``zq serve`` on its directory (it
recovers as the leader would have, from the same records); ``NotLeader`` meanwhile
tells clients on its endpoint where the leader is. Plainly, what it does not do: without
``replicas_ack`` whatever the leader committed after the standby's last round is not
here (the lag, in stats); no election, no fencing of a leader that comes back (an elected
cluster, ``zq.server.cluster``, does both). A standby whose position the leader's
retention has passed starts over from a snapshot of the leader's journal
(``start_over``).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
from dataclasses import dataclass

import msgspec
import zmq

from zq import wire
from zq.core import limits
from zq.core.errors import JournalError, ZqError
from zq.journal import replica
from zq.journal.integrity import FILE_MODE, ID_FILE
from zq.journal.lmdb_journal import LmdbJournal
from zq.keys import apply_client_curve
from zq.server.router import Router
from zq.server.security import key_of
from zq.wire.records import array_header_size

log = logging.getLogger("zq.standby")
_monitors = itertools.count(1)

SNAPSHOT_WAIT_S = 600.0  # for the leader to copy its journal
SNAPSHOT_CHUNK = 4 << 20  # bytes asked for per snapshot-read (the leader's limit)
REQUEST_TIMEOUT_S = 30.0  # a leader that answers nothing in this long is treated as gone
BOUNDS_WAIT_MS = 1000  # caught up: how long the leader may hold a BOUNDS before answering that nothing came


class StandbyError(ZqError):
    code = "standby"


@dataclass
class StandbyState:
    position: int = 0  # every leader record below this is here
    leader_next: int = 0  # the leader's committed end, last seen
    records: int = 0  # records copied since start
    rounds: int = 0
    caught_up_at: float = 0.0  # monotonic time the standby last held everything the leader had committed
    connected: bool = False
    heard_at: float = 0.0  # monotonic time of the leader's last frame
    leader_heartbeat_s: float = 1.0  # the leader's heartbeat interval (its WELCOME)
    snapshots: int = 0  # times this copy started over from the leader's snapshot (left behind by retention)
    error: str = ""

    @property
    def lag_records(self) -> int:
        return max(0, self.leader_next - self.position)


HELD_FRAMES_MAX = 10_000  # frames a cluster standby keeps while no leader is known (beyond: dropped)
HELD_BYTES_MAX = 64 << 20  # ... and their bytes (a frame may be 64 MiB: 10,000 of them would be 640 GiB)
# ERRORs that end a copy's session (it tries again, with backoff): the session is gone, or
# the node no longer leads (it stepped down, or never led).
COPY_ENDING = (*wire.SESSION_ENDING, wire.NOT_LEADER)
HOLD_MIN_MS = 5000  # a client is kept waiting at least this long (an election takes the session timeout and a bit)


class NotLeader:
    """A standby's answer to clients on its own endpoint: it does not serve, the leader
    does (ERROR ``not-leader`` naming it; clients with several endpoints move there).
    A thread with its own ROUTER socket; heartbeats are not answered.

    In an elected cluster (``wait_for_leader``) it names a leader only while it can
    vouch for it (its copy heard from it within two heartbeats). Otherwise (the leader
    just died, an election is under way) it keeps what clients send, in order, and
    sends them heartbeats so that they wait: for a leader to be named to them, or for
    this node to win and hand the socket and the frames kept to its dispatcher, which
    answers them as if they had just arrived (``hand_over``). For ``hold_ms`` at most:
    a node that cannot vouch for long (its copy cannot reach a leader that others can)
    must not keep its clients for good; then they are answered ``not-leader`` naming
    no one, and move on to their next endpoint."""

    def __init__(self, binds: list[str], leader: str, context: zmq.Context | None = None, *,
                 router: Router | None = None, wait_for_leader: bool = False, heartbeat_ms: int = 1000,
                 hold_ms: int = HOLD_MIN_MS) -> None:
        self.ctx = context or zmq.Context.instance()
        if router is None:
            sock = self.ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            sock.setsockopt(zmq.MAXMSGSIZE, limits.FRAME_BYTES_MAX)  # as the dispatcher's own socket
            try:
                for b in binds:
                    sock.bind(b)
            except zmq.ZMQError as exc:
                sock.close(0)
                raise StandbyError(f"cannot bind {binds}: {exc}") from None
            router = Router(sock, list(binds), None, None)
        self.router = router
        self.sock = router.sock
        self.leader = leader
        self.copy: StandbyState | None = None  # the standby whose word vouches for the leader
        self.wait_for_leader = wait_for_leader
        self.heartbeat_s = heartbeat_ms / 1000
        self.held: list[tuple[bytes, bytes, str | None]] = []  # (peer, frame, its key) kept while no leader is vouched for
        self.held_bytes = 0
        self.held_since: dict[bytes, float] = {}  # peer -> when the oldest of its frames kept came
        self.unreachable: set[bytes] = set()  # peers a send failed to in this pass (forgotten after it)
        self.hold_s = hold_ms / 1000
        self.sent_on = 0  # clients answered because they waited hold_ms with no leader vouched for
        self.dropped = 0  # frames not kept (over HELD_FRAMES_MAX or HELD_BYTES_MAX)
        self.stopping = threading.Event()
        self.answered = 0
        self.thread = threading.Thread(target=self.run, name="zq-standby-not-leader", daemon=True)
        self.thread.start()

    def follow(self, leader: str, copy: StandbyState | None) -> None:
        """The leader is now ``leader`` (empty: none known), vouched for by ``copy``."""
        self.leader, self.copy = leader, copy

    def vouched(self) -> bool:
        if not self.wait_for_leader:
            return True
        copy = self.copy
        return bool(self.leader) and copy is not None and copy.connected and \
            time.monotonic() - copy.heard_at < 2 * copy.leader_heartbeat_s

    def run(self) -> None:
        """Answer until stopped or handed over; nothing a frame holds ends the thread (a
        failure is logged and the loop goes on), or that endpoint would go silent until
        the next failover."""
        while not self.stopping.is_set():
            try:
                self.serve()
            except Exception:  # noqa: BLE001 -- a bug here must not silence the endpoint: say it, go on
                log.exception("the standby's not-leader answerer failed; it goes on")
                self.stopping.wait(0.05)

    def serve(self) -> None:
        next_beat = 0.0
        while not self.stopping.is_set():
            vouched = self.vouched()
            if vouched and self.held:
                held, self.held, self.held_bytes = self.held, [], 0
                self.held_since.clear()
                for peer, frame, _ in held:
                    self.answer(peer, frame)
            elif not vouched and self.held and time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.heartbeat_s / 2
                self.send_on_waited_out(time.monotonic())
                for peer in self.held_since:  # keep them waiting: a leader is coming
                    self.send(peer, wire.HEARTBEAT_FRAME)
            self.forget_unreachable()
            if not self.sock.poll(20 if not vouched else 50):
                continue
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue
            if len(frames) != 2:
                continue
            peer, body = frames[0].bytes, frames[1].bytes
            if vouched:
                self.answer(peer, body)
            elif body == wire.HEARTBEAT_FRAME:
                continue  # (nothing to keep: it only says the client is there)
            elif len(self.held) < HELD_FRAMES_MAX and self.held_bytes + len(body) <= HELD_BYTES_MAX:
                self.held.append((peer, body, key_of(frames[1])))
                self.held_bytes += len(body)
                self.held_since.setdefault(peer, time.monotonic())
            else:
                self.dropped += 1

    def send_on_waited_out(self, now: float) -> None:
        """Answer the clients kept ``hold_s`` with no leader vouched for: ``not-leader``
        naming no one (their next endpoint may know), and keep nothing more of theirs."""
        gone = {peer for peer, since in self.held_since.items() if now - since >= self.hold_s}
        if not gone:
            return
        text = (f"this dispatcher is a standby and could name no leader to this client within "
                f"{self.hold_s:.0f}s: try another endpoint of the cluster")
        answers = [(peer, frame) for peer, frame, _ in self.held if peer in gone]
        self.forget(gone)  # (first: a client answered finds nothing more of it kept, and it counted)
        self.sent_on += len(gone)
        for peer, frame in answers:
            self.answer(peer, frame, text)

    def answer(self, peer: bytes, frame: bytes, text: str | None = None) -> None:
        """ERROR ``not-leader`` for one frame (none for HEARTBEAT and BYE): naming the
        leader, or saying ``text``."""
        try:
            cmd = wire.client_decoder.decode(frame)
        except (ValueError, TypeError, RecursionError):  # msgspec's errors, and a str that is not UTF-8
            cmd = None
        if type(cmd) is wire.Heartbeat or type(cmd) is wire.Bye:
            return
        if text is None:
            text = f"this dispatcher is a standby, not the leader; {wire.LEADER_HINT}{self.leader}"
        if self.send(peer, wire.encode(wire.Error(getattr(cmd, "req", 0) or 0, wire.NOT_LEADER, text))):
            self.answered += 1

    def send(self, peer: bytes, frame: bytes) -> bool:
        try:
            self.sock.send_multipart([peer, frame], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # gone, or not reading: nothing to tell it (and nothing more to keep, once the pass is over)
            self.unreachable.add(peer)
            return False

    def forget_unreachable(self) -> None:
        if self.unreachable:
            self.forget(self.unreachable)
            self.unreachable = set()

    def forget(self, peers: set[bytes]) -> None:
        """Keep nothing more of these peers' (one pass over what is kept, however many)."""
        self.held = [h for h in self.held if h[0] not in peers]
        self.held_bytes = sum(len(h[1]) for h in self.held)
        for peer in peers:
            self.held_since.pop(peer, None)

    def hand_over(self) -> tuple[Router, list[tuple[bytes, bytes, str | None]]]:
        """Stop answering; give the socket (with what waits in it) and the frames kept,
        in the order they came, to the caller."""
        self.stopping.set()
        self.thread.join(5)
        held, self.held, self.held_bytes = self.held, [], 0
        self.held_since.clear()
        return self.router, held

    def close(self) -> None:
        self.hand_over()[0].close()


class Standby:
    """Follow the dispatcher at ``endpoint`` into the journal at ``data``."""

    def __init__(self, endpoint: str, data: str, *, curve: tuple[bytes, bytes, bytes] | None = None,
                 batch: int = 65_536, context: zmq.Context | None = None, node: str = "", epoch: int = 0,
                 proof: str = "") -> None:
        self.endpoint = endpoint
        self.node = node  # in an elected cluster: this node's name, and the leader's epoch it expects
        self.epoch = epoch
        self.proof = proof  # shown in every BOUNDS: its node's token, or the leader's standby_secret (zq.server.trust)
        self.journal = LmdbJournal(data, durability="fsync")
        self.curve = curve
        self.batch = batch
        self.ctx = context or zmq.Context.instance()
        self.sock: zmq.Socket | None = None
        self.monitor: zmq.Socket | None = None  # the PAIR the socket's monitor reports to (dropped())
        self.req = 0
        self.stopping = threading.Event()
        self.tables_seen = -1  # the leader's count of table changes at the last copy of its tables
        self.state = StandbyState(position=replica.position(self.journal))
        self.last_epoch = replica.last_epoch(self.journal)  # the newest epoch in this journal's history

    # ------------------------------------------------------------- running

    def run(self, rounds: int | None = None) -> None:
        """Copy until ``stop()`` (or ``rounds`` rounds). A lost leader is retried with
        backoff; a standby the leader's retention has left behind raises."""
        backoff = 0.1
        done = 0
        try:
            while not self.stopping.is_set() and (rounds is None or done < rounds):
                try:
                    self.round()
                    backoff = 0.1
                except (TimeoutError, zmq.ZMQError) as exc:
                    if self.stopping.is_set():
                        break  # (told to stop: nothing failed)
                    self.state.connected, self.state.error = False, f"leader at {self.endpoint}: {exc}"
                    log.warning("standby: %s; retrying", self.state.error)
                    self.reset()
                    self.stopping.wait(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                done += 1
        finally:
            self.close()

    def stop(self) -> None:
        self.stopping.set()

    def round(self) -> int:
        """One round: bounds, ranges, tables, store. Returns the records copied."""
        st = self.state
        # Where this copy is (synced: what replicated confirmations wait for), and a wait
        # of up to a second for the leader's journal to pass it: caught up, the answer
        # comes as soon as the leader commits more.
        pos = st.position
        bounds = self.request(lambda req: wire.Bounds(req, None, pos, BOUNDS_WAIT_MS, pos, self.node, self.epoch,
                                                                self.proof))
        end, tables_version = bounds["next_seq"], bounds.get("tables", -1)
        if bounds.get("epoch", 0) < self.epoch:  # fenced at the resource: no records from a deposed leader
            raise StandbyError(f"{self.endpoint} leads epoch {bounds.get('epoch', 0)}, older than {self.epoch}: "
                               "not copied")
        st.leader_next = end
        st.connected, st.error = True, ""
        start = st.position
        if start >= end:
            st.caught_up_at = time.monotonic()
            if tables_version != self.tables_seen:  # no new records, but a queue declared or deleted
                self.store([], [], start, tables_version)
            return 0
        # Both kinds at once (two requests in flight): the reader thread answers in turn.
        (msgs, m_next, m_done), (events, e_next, e_done) = self.fetch(start, end)
        upto = min(end if m_done else m_next, end if e_done else e_next)
        msgs = [raw for raw in msgs if replica.record_seq(raw) < upto]
        events = [raw for raw in events if replica.record_seq(raw) < upto]
        # Bookmarks are dense (every one is a message or an event), so a window with fewer
        # records than bookmarks lost some: the leader's retention deleted them before this
        # standby copied them. (A new standby starts wherever the leader's journal does.)
        if start and len(msgs) + len(events) != upto - start:
            self.start_over(start)
            return 0
        self.store(msgs, events, upto, tables_version)
        st.position = upto
        st.records += len(msgs) + len(events)
        st.rounds += 1
        if upto >= end:
            st.caught_up_at = time.monotonic()
        return len(msgs) + len(events)

    def store(self, msgs: list[bytes], events: list[bytes], upto: int, tables_version: int) -> None:
        """Store a window, with the small tables when they changed (a queue declared or
        deleted, recovery points moved; a leader that does not say: every time), read
        after the ranges: never older than the records."""
        if tables_version == self.tables_seen and tables_version >= 0:
            replica.apply(self.journal, msgs, events, upto)
            return
        tables = self.request(lambda req: wire.Admin(req, "journal-tables", {}))
        replica.apply(self.journal, msgs, events, upto, tables["declared"], tables["recovery_points"],
                      tables["first_seq"], [tuple(e) for e in tables["epochs"]] if "epochs" in tables else None)
        if "epochs" in tables:
            self.last_epoch = max([self.last_epoch] + [e for e, _ in tables["epochs"]])
        self.tables_seen = tables_version

    def start_over(self, at: int) -> None:
        """The leader's retention deleted records this copy never had (it is at ``at``):
        records cannot bring it back. Copy the leader's whole journal instead (a
        snapshot, ``zq.server.snapshots``), install it as this journal and go on from
        its end."""
        log.warning("standby: the leader's retention deleted records this copy never had (it is at %d): "
                    "starting over from a snapshot of the leader's journal", at)
        snap = self.request(lambda req: wire.Admin(req, "snapshot-begin", {}))
        deadline = time.monotonic() + SNAPSHOT_WAIT_S
        while True:
            status = self.request(lambda req: wire.Admin(req, "snapshot-status", {"id": snap["id"]}))
            if status["error"]:
                raise StandbyError(f"the leader could not make a snapshot: {status['error']}")
            if status["ready"]:
                break
            if time.monotonic() > deadline or self.stopping.wait(0.2):
                raise TimeoutError("no snapshot")
        path = self.journal.path
        partial = os.path.join(path, "snapshot.partial")
        with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE), "wb") as f:
            offset, size = 0, status["size"]
            while offset < size:
                chunk = self.request(lambda req: wire.Admin(req, "snapshot-read", {
                    "id": snap["id"], "offset": offset, "size": min(SNAPSHOT_CHUNK, size - offset)}))
                if not chunk:
                    raise StandbyError("the leader's snapshot ended early")
                f.write(chunk)
                offset += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        self.journal.close()
        # The journal is replaced on purpose: its directory's mark goes first (a mark
        # left naming the old journal would refuse the new one, rightly, at the next start).
        try:
            os.remove(os.path.join(path, ID_FILE))
        except FileNotFoundError:
            pass
        os.replace(partial, os.path.join(path, "data.mdb"))
        try:
            os.remove(os.path.join(path, "lock.mdb"))  # the old file's reader table
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.journal = LmdbJournal(path, durability="fsync")
        end = self.journal.next_seq()
        replica.apply(self.journal, [], [], end)  # the position: everything below the copy's end is here
        self.state.position, self.state.snapshots = end, self.state.snapshots + 1
        self.tables_seen = -1
        self.last_epoch = replica.last_epoch(self.journal)
        log.warning("standby: installed the leader's snapshot (%d bytes); copying on from bookmark %d", size, end)

    def fetch(self, start: int, end: int) -> list[tuple[list[bytes], int, bool]]:
        """The stored messages and events in [start, end), as far as one answer each goes."""
        out = []
        for rec in self.request_all([lambda req, k=kind: wire.Range(req, k, start, end, None, self.batch)
                                     for kind in ("messages", "events")]):
            sizes = memoryview(rec.sizes).cast("I")
            at = array_header_size(len(sizes))
            blob = rec.blob
            raws = []
            for size in sizes:
                raws.append(bytes(blob[at : at + size]))
                at += size
            out.append((raws, rec.next, rec.done))
        return out

    # ------------------------------------------------------------ the wire

    def connect(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        self.sock = sock  # (from here on reset() closes it, and its monitor, whatever fails below)
        apply_client_curve(sock, self.curve)
        sock.setsockopt(zmq.LINGER, 0)
        # A leader whose process died closed the connection: know it now, not after a
        # request's timeout (in a cluster, this node then stops naming it to clients).
        # The monitor has its own address (pyzmq's is made of the socket's descriptor,
        # which a new socket can reuse while the old one is still bound) and no receive
        # limit: libzmq's I/O thread blocks on a full monitor, and every socket with it.
        address = f"inproc://zq-standby-monitor-{os.getpid()}-{next(_monitors)}"
        sock.monitor(address, zmq.EVENT_DISCONNECTED)
        mon = self.monitor = self.ctx.socket(zmq.PAIR)
        mon.setsockopt(zmq.LINGER, 0)
        mon.setsockopt(zmq.RCVHWM, 0)
        mon.connect(address)
        sock.connect(self.endpoint)
        sock.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, f"zq standby {self.node}".strip())))
        welcome = self.expect(lambda m: type(m) is wire.Welcome)
        if type(welcome) is wire.Error:  # not (or no longer) the leader: try again, as after silence
            raise TimeoutError(f"{welcome.code}: {welcome.message}")
        if type(welcome) is wire.Welcome:
            self.state.leader_heartbeat_s = welcome.heartbeat_ms / 1000
        if self.epoch:
            self.truncate_to_leader()
        return sock

    def truncate_to_leader(self) -> None:
        """In a cluster, before copying: delete what this journal holds past where the
        leader's history goes on from this journal's last epoch (what a deposed leader
        wrote, or a standby copied from it, that the new leader never had: KIP-101)."""
        mine = replica.last_epoch(self.journal)
        answer = self.request(lambda req: wire.Admin(req, "epoch-end", {"epoch": mine}))
        end = min(answer["end"], self.journal.next_seq())
        deleted = replica.truncate_from(self.journal, end)
        if deleted:
            log.warning("standby: deleted %d records past bookmark %d (written in epoch %d; the leader's "
                        "epoch %d goes on from there)", deleted, end, mine, answer["epoch"])
        self.state.position = end
        self.tables_seen = -1

    def request(self, make):  # type: ignore[no-untyped-def]
        return self.request_all([make])[0]

    def request_all(self, makes: list) -> list:  # type: ignore[type-arg]
        """Send every request, then collect their answers (in the order asked)."""
        sock = self.sock or self.connect()
        reqs = []
        for make in makes:
            self.req += 1
            reqs.append(self.req)
            sock.send(wire.encode(make(self.req)))
        got: dict[int, object] = {}
        while len(got) < len(reqs):
            msg = self.expect(lambda m: getattr(m, "req", None) in reqs)
            if type(msg) is wire.Error:
                if msg.code in COPY_ENDING:
                    self.reset()
                    raise TimeoutError(f"session ended ({msg.code}: {msg.message})")
                raise StandbyError(f"the leader refused: {msg.code}: {msg.message}")
            got[msg.req] = msg.data if type(msg) is wire.Reply else msg  # type: ignore[attr-defined]
        return [got[r] for r in reqs]

    def expect(self, wanted):  # type: ignore[no-untyped-def]
        assert self.sock is not None
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        poller = zmq.Poller()  # the socket, and its monitor: a dropped connection is known at once
        poller.register(self.sock, zmq.POLLIN)
        if self.monitor is not None:
            poller.register(self.monitor, zmq.POLLIN)
        while True:
            # Stopped: at once, even while frames keep coming. A node that stepped down
            # and knows no leader yet holds our request and sends heartbeats so that we
            # wait; checked only when nothing came, a stop waited out REQUEST_TIMEOUT_S,
            # and so did the node's move to the new leader (and its clients with it).
            if self.stopping.is_set():
                raise TimeoutError("stopped")
            left = deadline - time.monotonic()
            ready = dict(poller.poll(math.ceil(min(left, 0.1) * 1000))) if left > 0 else {}  # (up: no spin)
            if self.dropped():
                self.state.connected = False
                raise TimeoutError("its connection dropped")
            if self.sock not in ready:
                if left <= 0:
                    raise TimeoutError("no answer")
                continue
            try:
                msg = wire.server_decoder.decode(self.sock.recv())
            except msgspec.MsgspecError as exc:
                raise StandbyError(f"an undecodable frame from the leader: {exc}") from None
            self.state.heard_at = time.monotonic()
            if wanted(msg) or (type(msg) is wire.Error and msg.code in COPY_ENDING):
                return msg
            # heartbeats and anything else: the session is alive

    def dropped(self) -> bool:
        if self.monitor is None:
            return False
        try:
            self.monitor.recv_multipart(zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def reset(self) -> None:
        """Close the session's socket and its monitor (switched off first: libzmq would
        otherwise block on an event for a PAIR that is gone)."""
        if self.sock is not None:
            if self.monitor is not None:
                try:
                    self.sock.monitor(None, 0)
                except zmq.ZMQError:
                    pass
                self.monitor.close(0)
                self.monitor = None
            self.sock.close(0)
            self.sock = None

    def close(self) -> None:
        self.reset()
        try:
            self.journal.close()
        except JournalError as exc:
            log.error("standby journal close: %s", exc)
