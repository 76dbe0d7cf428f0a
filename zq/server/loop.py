"""The ROUTER adapter: sockets and disk around the sans-IO engine.

One loop iteration (ANCHORS rule 3):

1. ``poll`` once (the timeout is the engine's next deadline or the next heartbeat);
2. read every frame waiting (asked with ``getsockopt(EVENTS)`` before each ``recv``), at
   most ``FRAMES_PER_ITERATION`` and the time and byte budgets, feeding each frame to
   the engine; replies are *held*;
3. ``advance`` and ``drain`` the engine; append its records and commit once;
4. only then send the held replies (publish confirmations) and the deliveries.

Peer misbehaviour never raises out of the loop: a frame that does not decode, a
command out of order, an unknown queue or an oversized message each get an ``Error``
reply naming the problem, and the loop goes on serving everyone else.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import zmq

from zq import wire
from zq.server.config import Config
from zq.core import limits
from zq.core import records as R
from zq.core.effects import Revoke
from zq.core.engine import Engine
from zq.core.errors import ConfigError, JournalError, LimitError, NotEntitledError, ProtocolError, ZqError
from zq.journal.integrity import JournalDamaged
from zq.journal.lmdb_journal import LmdbJournal
from zq.journal.salvage import recover
from zq.server.commands import HANDLERS, INTERNAL, BulkAction, Commands
from zq.server.held import HeldConfirmations
from zq.server.quotas import KeyQuotas
from zq.server.local import LinkClosedError, LocalLink
from zq.server.outflow import PULL_COMMANDS, UNSQUEEZED, Outflow, frames_of
from zq.server.outflow import peer_address as outflow_peer_address
from zq.server.outflow import shut_down as outflow_shut_down
from zq.server.ranges import RangeReader
from zq.server.replay import Replayer
from zq.server.router import Router, open_router
from zq.server.security import Rights, Security, SecuritySection, key_of
from zq.server.sessions import Peer, PeerTable, sub_key, wall_ms
from zq.server.snapshots import Snapshots
from zq.server.stats import Stats

if TYPE_CHECKING:
    from zq.server.leadership import LeaderDuty

log = logging.getLogger("zq.server")

FRAMES_PER_ITERATION = 1000
RECEIVE_BUDGET_S = 0.03  # stop reading after this long (plus one frame): what was read is committed and answered first
RECEIVE_BYTES_BUDGET = 16 * 1024 * 1024  # ... or this many bytes (plus one frame): each is copied a few times until committed
# Socket flags as plain ints: ``zmq.SNDMORE | zmq.NOBLOCK`` builds an enum member on
# every call (0.36 us), paid per frame sent.
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_SRCFD = int(zmq.SRCFD)  # a received frame's connection (its file descriptor): zq.server.outflow
# A frame from a connection with no session (no HELLO yet, timed out, or an earlier
# server's): in words for whoever reads them; the code, no-session, is what clients act on.
NO_SESSION_TEXT = ("this connection has no session (it timed out, or the dispatcher restarted): "
                   "the client reconnects by itself")
NO_SESSION_NEW_KEY = "this connection has no session for its new key: the client reconnects by itself"
SETTLES: frozenset[type] = frozenset({wire.Ack, wire.Cancel, wire.Expire, wire.Extend})
TRANSACTIONS: frozenset[type] = frozenset({wire.Transact, wire.TransactMany})  # always answered: the unread check
SETTLE_QUIET_MAX = 1024  # bookmarks in a settle without ``req`` that a peer over its unread limit may still send
STRANGER_ANSWERS_MAX = 64  # answers to a connection with no session (a client re-says HELLO at its first)
STRANGER_TEXT_MAX = 200  # characters of an ERROR's text to a connection with no session
ERROR_TEXT_MAX = 2000  # characters of an ERROR's text: a decode error once echoed a 40 MiB tag back, unread
PAUSED_POLL_MS = 10  # while deliveries wait for a peer to read, how often the loop looks
RETENTION_INTERVAL_MS = 10_000
JOURNAL_RETRY_MS = 200  # while commits fail (a full disk), how often one is tried again
JOURNAL_FULL_BYTES = 1 << 20  # under this much free space a failed commit is called "disk full"
# What one loop iteration does, in order: the watchdog keeps the split of the longest.
LOOP_PHASES = ("receive", "bulk+ranges", "engine", "append", "commit+send", "claims+replay", "heartbeat+retention")
STANDBYS_NAMED_MAX = 8  # a NOTICE of a replicated wait names at most this many standbys
SLOW_COMMAND_MS = 100  # a command that holds the loop longer is logged (the watchdog's threshold)
BYE_FRAME = wire.encode(wire.Bye())
CONFIRM_TAG = wire.encode(wire.Confirm(0, []))[1:9]  # a CONFIRM frame's tag, as encoded: fixstr "confirm"


class Server(Commands, Stats):
    """A dispatcher bound to its endpoints; ``run()`` serves until ``stop()``.

    This class is the loop: sockets, the journal's commits, what is held until them,
    heartbeats and upkeep. What each command does is ``Commands`` (``commands.py``),
    what STATS reports is ``Stats`` (``stats.py``)."""

    def __init__(self, config: Config, *, context: zmq.Context | None = None, cluster: LeaderDuty | None = None,
                 router: Router | None = None) -> None:
        self.config = config
        if cluster is None and config.cluster_section.zookeeper:
            raise ConfigError("a [cluster] with zookeeper is served by its nodes (zq.server.cluster.Node, "
                              "`zq serve --node NAME`), not by a lone dispatcher")
        self.ctx = context or zmq.Context.instance()
        self.journal = LmdbJournal(config.data, durability=config.durability, fsync_interval_ms=config.fsync_interval_ms)
        try:
            self.engine: Engine = recover(self.journal, config.queues, auto_queues=config.auto_queues)
        except BaseException:
            self.journal.close()
            raise
        self.engine.expr_limits = config.expr_limits
        try:
            self.router = router or open_router(config, self.ctx)
        except ZqError:
            self.journal.close()
            raise
        self.sock = self.router.sock
        self.security: Security | None = self.router.security
        if self.security is not None:
            self.security_monitor = self.router.security_monitor
        self.reload_requested = False  # SIGHUP: read the allowlist again
        # SIGHUP also reads the entitlements again from here (``zq serve -c FILE``: the
        # file's [security]); None: only the allowlist is read again.
        self.rules_source: Callable[[], SecuritySection | None] | None = None
        self.endpoints: list[str] = self.router.endpoints
        # An elected cluster's leader (zq.server.cluster): whether it may serve, its
        # epoch, the in-sync standbys. None: a dispatcher on its own.
        self.cluster = cluster
        if cluster is not None:
            cluster.wake = self.wake
        self.peers: dict[bytes, Peer] = PeerTable()  # by routing id; ``by_label``: by the session's public name
        self.asking: Peer | None = None  # the remote session whose frame is being handled (what STATS may show it)
        # The direct path (zq.server.local): in-process sessions step the dispatcher in
        # their own threads under this lock; the loop thread holds it for each iteration.
        self.lock = threading.Lock()
        self.links: dict[bytes, LocalLink] = {}
        self.link_serial = 0
        self.stepping_locally = False  # a local step is running: remote frames go to the outbox
        self.outbox: list[tuple[bytes, bytes]] = []  # frames for remote peers, sent by the loop thread
        self.wake_at_ms = 0  # when the loop thread's poll returns by itself
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.wake_r, zmq.POLLIN)
        self.stopping = threading.Event()
        self.started_ms = wall_ms()
        self.next_heartbeat_ms = 0
        self.next_retention_ms = self.started_ms + RETENTION_INTERVAL_MS
        self.held: list[tuple[bytes, bytes, bool]] = []  # replies waiting for the commit (peer, frame, durable)
        # What waits on a commit: (replies, deliveries) per iteration, kept while commits fail.
        self.deferred: list[tuple[list[tuple[bytes, bytes, bool]], list]] = []
        self.urgent_pending = False
        self.journal_down: str | None = None  # the cause, while commits fail
        self.journal_down_since = 0
        self.journal_retry_ms = 0
        self.journal_failures = 0
        self.claims: dict[str, tuple[bytes, int, int]] = {}  # open claim: engine sub -> peer, req, deadline
        self.claim_dues: list[tuple[int, str, int]] = []  # heap: (deadline, engine sub, req), stale ones skipped
        # Confirmations held back: on full queues (flow control), and with replicas_ack until
        # that many standbys have synced past their last bookmark (zq.server.held).
        self.confirmations = HeldConfirmations()
        # Standbys' BOUNDS waiting for the journal to grow (peer, req, after, due ms).
        self.bounds_waiting: list[tuple[bytes, int, int, int, int]] = []  # ... and the tables' version then
        # Look at the waiting ones only when the journal or its tables moved, or the earliest wait ends.
        self.bounds_seen: tuple[int, bool, int] = (-1, False, -1)
        self.bounds_wake_ms = 0
        self.replayer = Replayer(self.journal, lambda: self.engine, per_peer_max=config.max_replays_per_connection,
                                 total_max=config.max_replays)
        self.snapshots = Snapshots(self.journal)  # whole-journal copies for standbys left behind
        self.replicate_after_drain: list[tuple[bytes, bytes]] = []
        self.ranges = RangeReader(self.journal, self.ctx, self.queue_covers, requests_max=config.max_range_requests)
        self.poller.register(self.ranges.loop_side, zmq.POLLIN)
        if self.security is not None:
            self.poller.register(self.security_monitor, zmq.POLLIN)
        self.frames_in = 0
        self.frames_out = 0
        # The watchdog: what held the loop longest, and failures the safety net caught
        # (each one is a bug to fix: the fuzzer fails on any).
        self.loop_max_ms = 0.0
        self.loop_max_phases: dict[str, float] = {}  # where the longest iteration's time went
        self.marks: tuple[float, ...] = ()
        self.slowest_command: tuple[float, str] = (0.0, "")
        self.slow_commands = 0
        self.internal_errors = 0
        # Bulk operator actions under way: one slice of one of them per iteration.
        self.bulk_actions: collections.deque[BulkAction] = collections.deque()
        self.pending_rights: Rights | None = None  # the key's rights, from the HELLO frame being handled
        self.pending_key: str | None = None  # ... and the key (None: no key, an in-process link)
        self.quotas = KeyQuotas()  # what one key may hold of what all share
        # Bytes sent to each peer that it has not read, bounded (zq.server.outflow); the
        # peers whose deliveries wait for them to read.
        self.outflow = Outflow(config.max_unread_bytes, config.max_unread_total_bytes)
        self.paused_peers: set[bytes] = set()
        self.over_peers: set[bytes] = set()  # found over the limit: cut off if they read nothing for long
        self.leftovers: dict[bytes, Peer] = {}  # ended sessions whose connection still holds unread bytes
        # Connections with no session, by routing id: [answers sent, descriptor, address]
        # (``may_answer_stranger``); ``taking_fd``: the descriptor of the frame being handled.
        self.strangers: dict[bytes, list] = {}
        self.strangers_silenced = 0
        self.taking_fd = -1
        self.carried: tuple[bytes, bytes, str | None, int] | None = None  # a big frame put off to the next iteration
        self.closed = False
        self.samples: collections.deque[tuple[int, tuple[int, int, int]]] = collections.deque(maxlen=16)
        self.snapshot: dict | None = None
        self.metrics = None
        if config.metrics:
            from zq.server.metrics import serve_metrics

            try:
                self.metrics = serve_metrics(self.metrics_snapshot, config.metrics)
            except ZqError:
                self.close()  # the sockets and the journal opened above
                raise

    # ----------------------------------------------------------- lifecycle

    def stop(self) -> None:
        """Ask the loop to finish (thread- and signal-safe)."""
        self.stopping.set()
        self.wake()

    def adopt(self, frames: list[tuple[bytes, bytes, str | None]]) -> None:
        """Frames that reached this socket before this dispatcher served it (a cluster
        node's, kept during its election), handled in order before anything else; their
        answers go out after the first commit, as every answer does."""
        now = wall_ms()
        with self.lock:
            for peer_id, body, user in frames:
                self.frames_in += 1
                self.receive(peer_id, body, now, user)

    def wake(self) -> None:
        """Have the loop look again now (thread-safe)."""
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    def metrics_snapshot(self) -> dict | None:
        """The last heartbeat's stats, with the journal's sync figures read now (from the
        metrics thread): a disk slow enough to make the loop wait shows while it waits."""
        snap = self.snapshot
        if snap is None:
            return None
        journal = {**snap["server"]["journal"], **self.journal.sync_stats()}
        return {**snap, "server": {**snap["server"], "journal": journal}}

    def reread_rules(self) -> None:
        """SIGHUP: the entitlements as the config file says now. A file that no longer
        reads (or lost [security]) changes nothing: said in the log, the rules stay."""
        if self.rules_source is None or self.security is None:
            return
        try:
            section = self.rules_source()
        except ZqError as exc:
            self.security.reload_failed += 1
            log.error("SIGHUP: %s; the entitlements stay as they were", exc)
            return
        except Exception:  # (an operator's signal must never stop the dispatcher)
            self.security.reload_failed += 1
            log.exception("SIGHUP: the config file could not be read again; the entitlements stay as they were")
            return
        if section is None:
            self.security.reload_failed += 1
            log.error("SIGHUP: the config has no [security] now; the entitlements stay as they were "
                      "(security cannot be turned off while serving)")
            return
        running = self.security.section
        if section.allow != running.allow or section.secret_key != running.secret_key:
            log.warning("SIGHUP: [security] allow or secret_key is another path in the config file now: that takes "
                        "effect at the next start; the entitlements are read again now")
        try:
            self.security.set_rules(section)
        except Exception:  # (a key file that changed under us since the check: the rules stay)
            self.security.reload_failed += 1
            log.exception("SIGHUP: the entitlements could not be applied; they stay as they were")
            return
        log.info("SIGHUP: entitlements read again (%d keys with rules of their own)", len(section.client))

    def request_reload(self) -> None:
        """SIGHUP: read the allowlist again at the next heartbeat (signal-safe)."""
        self.reload_requested = True
        self.next_heartbeat_ms = 0
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.iteration()
            self.iteration(poll=False)  # commit and send whatever is in hand
        finally:
            self.close()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for link in self.links.values():
                link.end()
            self.links.clear()
        if self.metrics is not None:
            self.metrics.shutdown()
        self.router.close(linger_ms=500)
        self.ranges.close()  # before the journal: the reader thread uses it
        self.snapshots.close()  # (so do copies under way)
        self.journal.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    # ----------------------------------------------------------- the loop

    def poll_timeout_ms(self, now: int) -> int:
        deadline = self.next_heartbeat_ms
        d = self.engine.next_deadline_ms()
        if d is not None:
            deadline = min(deadline, d)
        claim_due = self.next_claim_due() if self.claims else None
        if claim_due is not None:
            deadline = min(deadline, claim_due)
        if self.bounds_waiting:
            deadline = min(deadline, self.bounds_wake_ms)
        if self.confirmations.waits:  # (a publisher may be due a NOTICE of what it waits for)
            deadline = min(deadline, self.confirmations.next_notice_ms)
        if self.journal_down is not None:
            deadline = min(deadline, self.journal_retry_ms)
        elif self.replayer.busy() or self.bulk_actions or self.carried is not None:
            return 0
        if self.paused_peers:  # (the socket does not say when a peer has read: look again soon)
            deadline = min(deadline, now + PAUSED_POLL_MS)
        return max(0, min(deadline - now, 1000))

    def iteration(self, poll: bool = True) -> None:
        now = wall_ms()
        if self.cluster is not None and not self.cluster.serving():
            self.fenced(now)
            return
        if poll:
            with self.lock:
                timeout = self.poll_timeout_ms(now)
                self.wake_at_ms = now + timeout
            ready = dict(self.poller.poll(timeout))
            if self.wake_r in ready:
                try:
                    os.read(self.wake_r, 4096)
                except BlockingIOError:
                    pass
            now = wall_ms()
        started = time.perf_counter()
        try:
            with self.lock:
                self.serve_once(now)
        finally:
            took_ms = (time.perf_counter() - started) * 1000
            if took_ms > self.loop_max_ms:
                self.loop_max_ms = took_ms
                marks = self.marks
                self.loop_max_phases = {name: round((marks[i + 1] - marks[i]) * 1000, 3)
                                        for i, name in enumerate(LOOP_PHASES) if i + 1 < len(marks)}

    def fenced(self, now: int) -> None:
        """A cluster leader that may not serve (its lease ran out, its ZooKeeper
        connection is suspended, a newer epoch exists): read nothing, send nothing,
        until the lease is renewed or the node steps down (``zq.server.cluster``)."""
        try:
            select.select([self.wake_r], [], [], 0.05)
            os.read(self.wake_r, 4096)
        except (BlockingIOError, OSError):
            pass

    def serve_once(self, now: int) -> None:
        """One iteration after the poll: read, step the engine, commit, send."""
        clock = time.perf_counter
        t0 = clock()
        if self.outbox:
            self.flush_outbox()
        if self.security is not None:
            self.security.count_refusals()
        self.receive_all(now)
        t1 = clock()
        if self.bulk_actions:
            self.run_bulk(now)
        for peer_id, frame in self.ranges.answers():
            peer = self.peers.get(peer_id)
            if peer is not None:  # (its session ended meanwhile: dropped)
                peer.ranges_waiting = max(0, peer.ranges_waiting - 1)
                self.send(peer_id, frame)
        t2 = clock()
        self.engine.advance(now)
        out = self.engine.drain(now)
        t3 = clock()
        self.stage(out)
        t4 = clock()
        if self.journal_down is None or now >= self.journal_retry_ms:
            self.commit_and_send(now)
        t5 = clock()
        if self.claims:
            self.end_due_claims(now)
        elif self.claim_dues:
            self.claim_dues.clear()  # (all stale: answered before their deadline)
        if self.bounds_waiting:
            self.answer_bounds(now)
        if self.cluster is not None:
            self.cluster.tick(self.peers, now, self.engine.next_seq)
        if self.confirmations.replicated:
            self.release_replicated()
        if self.confirmations.waits and now >= self.confirmations.next_notice_ms:
            self.notify_held(now)
        if self.paused_peers:
            self.resume_paused(now)
        if self.journal_down is None:
            self.replayer.pump(self.send, self.not_reading)
        t6 = clock()
        if now >= self.next_heartbeat_ms:
            self.heartbeat(now)
        if now >= self.next_retention_ms and self.journal_down is None:
            self.retention(now)
        self.marks = (t0, t1, t2, t3, t4, t5, t6, clock())

    def stage(self, out) -> None:  # type: ignore[no-untyped-def]
        """Append what the engine produced; hold the replies and deliveries for the commit."""
        self.journal.append(out.records)
        if self.replicate_after_drain:  # transactions' answers: every record of the step below next_seq
            for peer_id, frame in self.replicate_after_drain:
                self.confirmations.hold_replicated(peer_id, frame, self.engine.next_seq)
            self.replicate_after_drain = []
        # Only fsync mode asks whether a commit must reach the disk before sending.
        self.urgent_pending |= self.config.durability == "fsync" and self.is_urgent(out.records)
        # Revokes follow the deliveries they name (never overtake one still waiting on a commit).
        self.deferred.append((self.held, out.deliveries + out.revokes if out.revokes else out.deliveries))
        self.held = []
        for notice in self.engine.notices:
            log.warning("%s", notice)
        self.engine.notices.clear()

    # ------------------------------------------------------ the direct path

    def open_link(self, name: str) -> LocalLink:
        """A new in-process session (zq.server.local), with its HELLO handled: the
        WELCOME is in its inbox when this returns."""
        with self.lock:
            if self.closed:
                raise LinkClosedError("the embedded dispatcher has stopped")
            self.link_serial += 1
            # LOCAL_ID_BYTES (264) bytes: never a ROUTER routing id, which libzmq keeps to
            # 1..255 bytes (a client may choose its own, zero byte first included).
            link = LocalLink(self, local_link_id(self.link_serial))
            self.links[link.peer_id] = link
        link.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, name, [wire.NOTICE])))
        return link

    def close_link(self, link: LocalLink) -> None:
        """The client closed its link: end the session if it did not say BYE."""
        with self.lock:
            if self.links.get(link.peer_id) is not link:
                return
            now = wall_ms()
            if link.peer_id in self.peers:
                self.step_locally(link.peer_id, BYE_FRAME, now)
            del self.links[link.peer_id]
            self.wake_loop_if_due(now)

    def local_step(self, link: LocalLink, frame: bytes) -> None:
        """One frame from an in-process session, handled in the sender's thread."""
        with self.lock:
            if self.closed or self.links.get(link.peer_id) is not link:
                raise LinkClosedError("the embedded dispatcher has stopped")
            now = wall_ms()
            self.step_locally(link.peer_id, frame, now)
            self.wake_loop_if_due(now)

    def step_locally(self, peer_id: bytes, frame: bytes, now: int) -> None:
        """``serve_once`` for one frame without the socket: the same handlers, the same
        commit before anything leaves. Frames for remote peers wait in the outbox."""
        self.stepping_locally = True
        try:
            self.frames_in += 1
            self.receive(peer_id, frame, now, trusted=True)
            self.engine.advance(now)
            self.stage(self.engine.drain(now))
            if self.journal_down is None or now >= self.journal_retry_ms:
                self.commit_and_send(now)
            if self.bounds_waiting:  # a standby waiting for this commit (its answer goes by the outbox)
                self.answer_bounds(now)
            if self.confirmations.replicated:
                self.release_replicated()
        finally:
            self.stepping_locally = False

    def wake_loop_if_due(self, now: int) -> None:
        """Wake the loop thread when a local step left it work: remote frames to send,
        or a timer earlier than the one its poll is waiting for."""
        if self.outbox or now + self.poll_timeout_ms(now) < self.wake_at_ms:
            self.wake_at_ms = now
            try:
                os.write(self.wake_w, b"x")
            except OSError:
                pass

    def flush_outbox(self) -> None:
        outbox, self.outbox = self.outbox, []
        for peer_id, frame in outbox:
            self.send(peer_id, frame, counted=True)  # (counted when it was put there)

    def commit_and_send(self, now: int) -> None:
        """Commit what is staged; then, and only then, send what waited on it.

        A commit that fails (a full disk) loses nothing: the records stay staged and are
        committed again every ``JOURNAL_RETRY_MS``; what waits on them (confirmations,
        deliveries) waits with them; sessions and leases are kept; new publishes are
        refused with the cause until a commit succeeds, which resumes them by itself."""
        try:
            self.journal.commit(now, urgent=self.urgent_pending)
        except JournalError as exc:
            self.journal_failed(exc, now)
            for i, (held, deliveries) in enumerate(self.deferred):
                keep: list[tuple[bytes, bytes, bool]] = []
                for peer_id, frame, durable in held:
                    if not durable:
                        self.send(peer_id, frame, counted=True)  # answers that promise nothing leave now
                    elif frame[1:9] == CONFIRM_TAG:  # a publisher is told now, not after its timeout
                        req = wire.server_decoder.decode(frame).req  # type: ignore[union-attr]
                        self.send(peer_id, wire.encode(wire.Error(req, JournalError.code, (
                            f"{self.journal_down}: not confirmed; the messages may still be stored once the "
                            "journal takes writes again (publish them again with the same msg_id to be sure)"))))
                    else:
                        keep.append((peer_id, frame, durable))
                self.deferred[i] = (keep, deliveries)
            return
        self.urgent_pending = False
        if self.cluster is not None and not self.cluster.serving():
            return  # committed, not sent: a deposed leader's word is worth nothing (the new one sends it)
        if self.journal_down is not None:
            log.warning("journal writable again after %d ms: publishing resumed", now - self.journal_down_since)
            self.journal_down = None
        deferred, self.deferred = self.deferred, []
        for held, deliveries in deferred:
            for peer_id, frame, _ in held:
                self.send(peer_id, frame, counted=True)
            if self.confirmations.flow:
                self.release_flow_held()
            for d in deliveries:
                if type(d) is Revoke:
                    self.revoke(d)
                    continue
                self.deliver(d)
                claim = self.claims.pop(d.sub_id, None)
                if claim is not None:  # the claim's answer follows its DELIVER frames
                    self.engine.end_claim(d.sub_id)
                    self.send_after_deliveries(claim[0], wire.encode(wire.Reply(claim[1], {"count": len(d.seqs)})))

    def is_urgent(self, records: list) -> bool:
        """Must this commit reach the disk before anything is sent (durability fsync)?"""
        for r in records:
            t = type(r)
            if t is R.Message:
                return True  # a publish confirmation waits on it
            if t is R.Event and r.kind == R.LEASED:
                q = self.engine.queues.get(r.queue)
                if q is not None and q.at_most_once:
                    return True  # at-most-once: durable before the frame leaves
        return False

    def receive_all(self, now: int) -> None:
        sock = self.sock
        budget_end = time.perf_counter() + RECEIVE_BUDGET_S
        clock = time.perf_counter
        bytes_left = RECEIVE_BYTES_BUDGET
        taken = 0
        if self.carried is not None:  # a big frame put off by the last iteration: first now
            carried, self.carried = self.carried, None
            bytes_left -= len(carried[1])
            taken = 1
            self.take(*carried, now)
        for _ in range(FRAMES_PER_ITERATION):
            # Checked every frame (once every 64: 64 settles of 65,536 bookmarks, ~30 ms
            # each, held everyone else's round trip for seconds).
            if clock() > budget_end or bytes_left <= 0:
                return  # commit and send what we have; the rest is read next iteration
            # Asked, not read until zmq.Again: at a low rate every iteration ended in that
            # exception, ~5% of the loop thread's CPU (issue #34; zq.client.session.readable).
            if not sock.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]  # (EVENTS: an int)
                return
            try:
                peer_id = sock.recv(_NOBLOCK)
            except zmq.Again:  # (not expected after the check: kept as the safe ending)
                return
            user = None
            fd = -1
            if not sock.getsockopt(_RCVMORE):
                body = b""
            elif self.security is not None:
                # Every frame's key (ZAP's User-Id, in the frame's metadata): rights come from
                # the key that sent it, never from the routing id it came by.
                frame = sock.recv(copy=False)
                body, user = frame.bytes, key_of(frame)  # (none on an inproc connection: no ZAP there)
                known = self.peers.get(peer_id)
                if known is None or known.fd == -1:
                    fd = frame_fd(frame)
            else:
                known = self.peers.get(peer_id)
                if known is None or known.fd == -1:  # its connection not learnt yet (zq.server.outflow)
                    frame = sock.recv(copy=False)
                    body, fd = frame.bytes, frame_fd(frame)
                else:
                    body = sock.recv()
            extra = 0
            while sock.getsockopt(_RCVMORE):
                sock.recv()
                extra += 1
            self.frames_in += 1
            if extra:
                self.reply(peer_id, wire.Error(0, ProtocolError.code, f"expected one body frame, got {extra + 1}"))
                continue
            if taken and len(body) > bytes_left:
                # A big frame after others: handled first thing next iteration, so that the
                # small ones read with it are committed and answered without waiting on it.
                self.carried = (peer_id, body, user, fd)
                return
            bytes_left -= len(body)
            taken += 1
            self.take(peer_id, body, user, fd, now)

    def take(self, peer_id: bytes, body: bytes, user: str | None, fd: int, now: int) -> None:
        """Handle one frame read from the socket; learn its peer's connection if new
        (before the frame, so that its request is measured; after a HELLO, its session's)."""
        self.learn_connection(peer_id, fd)
        self.taking_fd = fd
        self.receive(peer_id, body, now, user)
        self.taking_fd = -1
        self.learn_connection(peer_id, fd)

    def learn_connection(self, peer_id: bytes, fd: int) -> None:
        """Attach the connection ``fd`` (``ZMQ_SRCFD``) to ``peer_id``'s session, if it has
        one whose connection is not known yet (zq.server.outflow)."""
        if fd != -1:
            peer = self.peers.get(peer_id)
            if peer is not None and peer.fd == -1:
                self.outflow.attach(peer, fd)

    def receive(self, peer_id: bytes, body: bytes, now: int, user: str | None = None, trusted: bool = False) -> None:
        """Handle one frame. ``trusted``: from an in-process session (the embedding
        process itself), which has every right."""
        try:
            cmd = wire.client_decoder.decode(body)
        except msgspec.ValidationError as exc:  # a subclass of DecodeError: check it first
            cut = ERROR_TEXT_MAX if peer_id in self.peers else STRANGER_TEXT_MAX
            self.reply(peer_id, wire.Error(0, ProtocolError.code, f"invalid command: {str(exc)[:cut]}"))
            return
        except (msgspec.DecodeError, ValueError) as exc:  # ValueError: a str that is not UTF-8
            cut = ERROR_TEXT_MAX if peer_id in self.peers else STRANGER_TEXT_MAX
            self.reply(peer_id, wire.Error(0, ProtocolError.code, f"malformed frame: {str(exc)[:cut]}"))
            return
        peer = self.peers.get(peer_id)
        secured = self.security is not None and not trusted
        if secured and peer is not None and peer.key != user:
            self.key_mismatch(peer_id, peer, user, now)
            peer = None
            if type(cmd) is not wire.Hello:
                self.reply(peer_id, wire.Error(getattr(cmd, "req", 0), wire.NO_SESSION, NO_SESSION_NEW_KEY))
                return
        if peer is None and type(cmd) is not wire.Hello:
            # Unknown here: never said HELLO, or its session died with an earlier server.
            self.reply(peer_id, wire.Error(getattr(cmd, "req", 0), wire.NO_SESSION, NO_SESSION_TEXT))
            return
        if peer is not None:
            peer.last_heard_ms = now  # any frame counts as a heartbeat
        started = time.perf_counter()
        try:
            if peer is not None and not trusted and (type(cmd) in PULL_COMMANDS or type(cmd) in TRANSACTIONS or (
                    type(cmd) in SETTLES and (cmd.req or len(cmd.bookmarks) > SETTLE_QUIET_MAX))):  # type: ignore[attr-defined]
                self.check_unread(peer)  # (a settle's answer can echo every bookmark: 590 KB for 65,536)
            if secured:
                if type(cmd) is wire.Hello and not self.security.allowed(user):  # type: ignore[union-attr]
                    # Connected before its key left the allowlist: no new session for it.
                    self.security.hello_refused += 1  # type: ignore[union-attr]
                    if peer is not None:
                        self.drop_peer(peer_id, now)
                    raise NotEntitledError("this client's key is no longer allowed")
                self.entitled(peer, cmd, user)
                self.asking = peer
            queues_before = len(self.engine.queues) if secured else 0  # (only a key's frames are counted)
            HANDLERS[type(cmd)](self, peer_id, peer, cmd, now)
            if secured and type(cmd) is wire.Hello:
                fresh = self.peers.get(peer_id)
                if fresh is not None:
                    fresh.key = user  # the session's key: every later frame must carry it
            elif secured and peer is not None and peer.key is not None and len(self.engine.queues) > queues_before:
                self.quotas.created(peer, len(self.engine.queues) - queues_before)
        except ZqError as exc:
            self.reply(peer_id, wire.Error(getattr(cmd, "req", 0), exc.code, str(exc)[:ERROR_TEXT_MAX]))
        except Exception as exc:  # noqa: BLE001 -- the safety net: one peer's frame never ends the dispatcher
            self.internal_errors += 1
            log.exception("internal error handling %s from %s", type(cmd).__name__, peer_id.hex()[:64])
            self.reply(peer_id, wire.Error(getattr(cmd, "req", 0), INTERNAL,
                                           f"internal error ({type(exc).__name__}); the dispatcher goes on"))
        finally:
            self.asking = None
            self.pending_rights = self.pending_key = None  # (a HELLO's, this frame's only)
        self.note_time(type(cmd).__name__, (time.perf_counter() - started) * 1000, peer_id)

    def key_mismatch(self, peer_id: bytes, peer: Peer, user: str | None, now: int) -> None:
        """A frame from another key than its session's (or none) came by that session's
        routing id: a peer that took the id of a connection that dropped (libzmq holds one
        connection per id, so the session's own is gone). Not handled under the session;
        the session ends now rather than at its dead-peer timeout, so that nothing more
        of it (deliveries, answers) goes to the newcomer. Counted, logged once per session."""
        assert self.security is not None
        self.security.key_mismatch += 1
        log.warning("session %s (%s, key %s) ended: a frame came by its routing id from another key (%s); "
                    "not handled under it", peer.label, peer.name, (peer.key or "?")[:12], (user or "none")[:12])
        self.drop_peer(peer_id, now)

    def recheck_sessions(self, now: int) -> None:
        """After a reload: end the sessions whose key is no longer allowed or whose
        entitlements shrank (their next frame gets ``no-session``); those whose rights
        grew get them now."""
        assert self.security is not None
        for peer_id, peer in list(self.peers.items()):
            if peer.key is None or peer_id in self.links:
                continue  # an in-process session: the embedding process itself
            rights = self.security.rights_of(peer.key)
            if not self.security.allowed(peer.key):
                why = "its key is no longer allowed"
            elif peer.rights is not None and not rights.covers(peer.rights):
                why = "its key's entitlements shrank"
            else:
                peer.rights = rights
                continue
            self.security.sessions_ended += 1
            log.warning("session %s (%s, key %s) ended on reload: %s", peer.label, peer.name, peer.key[:12], why)
            self.drop_peer(peer_id, now)

    def note_time(self, what: str, took_ms: float, who: bytes) -> None:
        """The watchdog: count what held the loop past its threshold, keep the slowest."""
        if took_ms > SLOW_COMMAND_MS:
            self.slow_commands += 1
            log.warning("%s from %s held the loop %.0f ms", what, who.hex(), took_ms)
        if took_ms > self.slowest_command[0]:
            self.slowest_command = (took_ms, what)

    # ------------------------------------------------------ held answers

    def release_flow_held(self) -> None:
        """Send confirmations whose queues are no longer over their limits."""
        queues = self.engine.queues
        self.confirmations.release_flow(lambda n: n in queues and queues[n].overflow.blocked, self.confirm)

    def notify_held(self, now: int) -> None:
        """Tell publishers whose held confirmations have not moved for a second what they
        wait for (a NOTICE, to sessions that accept it; ``zq.server.held``)."""
        replicas: str | None = None  # (the same words for every publisher: said once per tick)
        for peer_id, reason, wait in self.confirmations.due_notices(now):
            peer = self.peers.get(peer_id)
            if peer is None or not peer.notices:
                continue
            if reason is None:
                if replicas is None:
                    replicas = self.replicas_wait()
                notice = wire.Notice(wire.NOTICE_REPLICAS, replicas, wait.count, now - wait.since)
            else:
                notice = wire.Notice(wire.NOTICE_FLOW, self.flow_wait(reason), wait.count, now - wait.since, reason)
            self.send(peer_id, wire.encode(notice))

    def flow_wait(self, name: str) -> str:
        """What a confirmation held on flow-control queue ``name`` waits for, in words."""
        q = self.engine.queues.get(name)
        if q is None:
            return f"waiting for queue {name!r} to drain below its limits (overflow = flow-control)"
        s = q.settings
        limits_now = []
        if s.max_depth:
            limits_now.append(f"{q.held():,} messages of max_depth {s.max_depth:,}")
        if s.max_bytes:
            limits_now.append(f"{q.overflow.bytes:,} bytes of max_bytes {s.max_bytes:,}")
        return (f"queue {name!r} is over its limits ({', '.join(limits_now)}; overflow = flow-control): "
                f"confirmed once consumers drain it below {s.resume_percent}% of them")

    def replicas_wait(self) -> str:
        """What a confirmation held for the standbys waits for, in words: how many it
        needs, and which standbys are connected (in sync, how far behind) or none."""
        end = self.engine.next_seq
        standbys = sorted((p for p in self.peers.values() if p.replica_position >= 0),
                          key=lambda p: p.replica_position, reverse=True)

        def lag(n: int) -> str:
            return f"{n:,} record{'' if n == 1 else 's'} behind" if n else "has everything committed"

        def listed(peers: list[Peer]) -> str:
            shown = [f"{(p.node or p.name)[:64]!r} ({lag(end - p.replica_position)})" for p in peers[:STANDBYS_NAMED_MAX]]
            more = len(peers) - len(shown)
            return ", ".join(shown) + (f" and {more} more" if more > 0 else "")

        k = self.config.replicas_ack
        cluster = self.cluster
        if cluster is None:
            text = f"waiting for {k} standby{'s' if k != 1 else ''} to have it on disk (replicas_ack = {k})"
            if not standbys:
                return f"{text}; none is connected"
            few = f"only {len(standbys)} {'is' if len(standbys) == 1 else 'are'} connected" if len(standbys) < k \
                else f"{len(standbys)} connected"
            return f"{text}; {few}: {listed(standbys)}"
        in_sync = cluster.isr - {cluster.node}
        if not k:  # (a clean stop: every in-sync standby first)
            text = "waiting for every in-sync standby to have it on disk before this leader stops (hand-over)"
        else:
            need = cluster.need
            text = (f"waiting for {need} standby{'s' if need != 1 else ''} to have it on disk, and for every in-sync "
                    f"one (replicas_ack = {k}" + (f", min_insync = {need})" if need > k else ")"))
        if not standbys:
            return f"{text}; none is connected"
        synced = [p for p in standbys if p.node in in_sync]
        behind = [p for p in standbys if p.node not in in_sync]
        parts = [f"in sync: {listed(synced) if synced else 'none'}"]
        if behind:
            parts.append(f"connected, not in sync yet: {listed(behind)}")
        return f"{text}; {'; '.join(parts)}"

    # -------------------------------------------------- replicated confirmations

    def confirm(self, peer_id: bytes, frame: bytes) -> None:
        """Send a committed publish's CONFIRM, or with ``replicas_ack`` hold it until that
        many standbys have it on their disks (``release_replicated``)."""
        if not self.config.replicas_ack and (self.cluster is None or not self.cluster.handing_over):
            self.send(peer_id, frame)
            return
        self.hold_for_replicas(peer_id, frame, wire.server_decoder.decode(frame).bookmarks)  # type: ignore[union-attr]

    def hold_for_replicas(self, peer_id: bytes, frame: bytes, bookmarks: list[int]) -> None:
        """Hold a CONFIRM until the standbys have passed its last bookmark."""
        self.confirmations.hold_replicated(peer_id, frame, max(bookmarks, default=0) + 1)

    def replicated_upto(self) -> int:
        """Every record below this is synced on ``replicas_ack`` standbys (0: too few)."""
        if self.cluster is not None:
            return self.cluster.replicated_upto(self.peers, self.engine.next_seq)
        k = self.config.replicas_ack
        positions = sorted((p.replica_position for p in self.peers.values() if p.replica_position >= 0), reverse=True)
        return positions[k - 1] if len(positions) >= k else 0

    def release_replicated(self) -> None:
        """Send the held confirmations the standbys have passed (only those are looked at)."""
        if self.cluster is not None and not self.cluster.serving():
            return
        self.confirmations.release_replicated(self.replicated_upto(), self.send)

    def answer_bounds(self, now: int) -> None:
        """Standbys waiting for the journal to grow: answer those it passed (committed by
        now), or whose tables changed, or whose wait is over."""
        end = self.engine.next_seq
        committed = self.journal_down is None
        tables = self.engine.tables_changes
        state = (end, committed, tables)
        if state == self.bounds_seen and now < self.bounds_wake_ms:
            return  # (nothing moved: a scan would answer none of them)
        self.bounds_seen = state
        still = []
        wake = 1 << 62
        for peer_id, req, after, due, seen in self.bounds_waiting:
            if (committed and (end > after or tables != seen)) or due <= now:
                self.send(peer_id, wire.encode(wire.Reply(req, {"next_seq": end if committed else after,
                                                                  "seq_at": None,
                                                                  "tables": self.engine.tables_changes,
                                                                  "epoch": self.epoch})))
                peer = self.peers.get(peer_id)
                if peer is not None:
                    peer.bounds_waiting -= 1
            else:
                still.append((peer_id, req, after, due, seen))
                wake = min(wake, due)
        self.bounds_waiting = still
        self.bounds_wake_ms = wake

    @property
    def epoch(self) -> int:
        """This leader's epoch in its cluster (0: not in one)."""
        return self.cluster.epoch if self.cluster is not None else 0

    def queue_covers(self, name: str):  # type: ignore[no-untyped-def]
        """A queue's topic matcher for the reader thread: built from the queue's settings
        alone, so the thread never reads engine state."""
        q = self.engine.queues.get(name)
        if q is None:
            return None
        pattern = q.topic_re
        if pattern is None:
            return name.__eq__
        return lambda topic: pattern.fullmatch(topic) is not None

    def configured_queue(self, name: str) -> bool:
        """Is ``name`` a queue of the config file (which wins over run-time ones)?"""
        return any(q.name == name for q in self.config.queues)

    # ----------------------------------------------------------- sending

    def reply(self, peer_id: bytes, msg: object, durable: bool = False) -> None:
        """Answer after this iteration's commit. ``durable``: the answer says something
        was stored (a confirmation, an operator action's result): while commits fail it
        waits for one; every other answer then leaves at once."""
        try:
            frame = wire.encode(msg)
        except (OverflowError, TypeError, ValueError, msgspec.EncodeError) as exc:
            # An answer zq cannot encode is zq's bug, not the peer's: say so, keep serving.
            self.internal_errors += 1
            log.error("could not encode %s: %s", type(msg).__name__, exc)
            frame = wire.encode(wire.Error(getattr(msg, "req", 0), INTERNAL, f"answer not encodable: {exc}"))
        peer = self.peers.get(peer_id)
        if peer is not None:
            peer.out_bytes += len(frame)  # counted now: the next request sees what this one will send
            self.outflow.sent_since += len(frame)
        elif peer_id not in self.links and not self.may_answer_stranger(peer_id):
            return  # a connection with no session that has had its answers: it is not sent more
        self.held.append((peer_id, frame, durable))

    def send(self, peer_id: bytes, frame: bytes | zmq.Frame, counted: bool = False) -> bool:
        """Send one frame to ``peer_id`` now. ``counted``: a reply, whose bytes ``reply``
        already added to the peer's unread count (zq.server.outflow)."""
        if self.links:
            link = self.links.get(peer_id)
            if link is not None:
                link.push(frame if isinstance(frame, bytes) else frame.bytes)
                self.frames_out += 1
                return True
        if not counted:
            peer = self.peers.get(peer_id)
            if peer is not None:
                peer.out_bytes += len(frame)
                self.outflow.sent_since += len(frame)
        if self.stepping_locally:  # only the loop thread touches the socket
            self.outbox.append((peer_id, frame if isinstance(frame, bytes) else frame.bytes))
            return True
        try:
            self.sock.send(peer_id, _MORE_NOBLOCK)
            self.sock.send(frame, _NOBLOCK)
            self.frames_out += 1
            return True
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self.drop_peer(peer_id, wall_ms())  # gone: its leases break now
            elif exc.errno == zmq.EAGAIN:
                log.warning("peer %s is not reading (send queue full); dropping it", peer_id.hex())
                self.drop_peer(peer_id, wall_ms())
            else:
                raise
            return False

    def deliver(self, d) -> None:  # type: ignore[no-untyped-def]
        """Send journal records as they are stored (``msgspec.Raw``): no decode, no re-encode."""
        consumer, _, sub = d.sub_id.partition("/")
        peer = self.peers.by_label.get(consumer)  # type: ignore[attr-defined]
        if peer is None:
            return  # its session ended: its leases end with it (never sent to whoever has the id now)
        peer_id = peer.peer_id
        if peer.paused is not None or self.over_unread(peer):
            self.pause(peer, d)  # it has not read what it was sent: these wait, as bookmarks
            return
        self.send_deliveries(peer_id, d)

    def send_deliveries(self, peer_id: bytes, d, resumed: bool = False) -> None:  # type: ignore[no-untyped-def]
        """DELIVER frames of at most DELIVER_BATCH_MAX records and about DELIVER_FRAME_BYTES;
        between frames, if the peer has stopped reading, the rest waits (``pause``)."""
        seqs, deliveries = d.seqs, d.deliveries
        sub = d.sub_id.partition("/")[2]
        try:
            raws = self.journal.get_raw(seqs)
        except JournalDamaged:  # damaged on disk since recovery checked it: send the others, say which
            seqs, raws, deliveries = self.sound_raws(seqs, deliveries)
        peer = self.peers.get(peer_id)
        i = 0
        for part in frames_of(raws):
            if i and peer is not None and self.over_unread(peer):
                self.pause(peer, Held(d.sub_id, seqs[i:], deliveries[i:]), first=resumed)
                return
            if not self.send(peer_id, wire.encode(wire.DeliverRaw(sub, part, deliveries[i : i + len(part)]))):
                return
            i += len(part)

    def sound_raws(self, seqs: list[int], deliveries: list[int]) -> tuple[list[int], list[msgspec.Raw], list[int]]:
        """The records of ``seqs`` that are sound; the damaged ones are logged (their
        leases run out, and the queue's limits dead-letter them in the end)."""
        kept, raws, counts = [], [], []
        for seq, n in zip(seqs, deliveries):
            try:
                raws += self.journal.get_raw([seq])
                kept.append(seq)
                counts.append(n)
            except JournalDamaged as exc:
                log.error("not delivered: %s", exc)
        return kept, raws, counts

    def revoke(self, r: Revoke) -> None:
        consumer, _, sub = r.sub_id.partition("/")
        peer = self.peers.by_label.get(consumer)  # type: ignore[attr-defined]
        if peer is not None:
            self.send_after_deliveries(peer.peer_id, wire.encode(wire.Revoke(sub, r.seqs, r.epochs)))

    # ------------------------------------------------- peers that do not read

    def check_unread(self, peer: Peer) -> None:
        """Refuse a request with a big answer while its peer has not read what it was
        sent (zq.server.outflow): the refusal is a few bytes; the answer could be many."""
        if self.over_unread(peer):
            self.outflow.refused += 1
            self.note_over(peer)
            waiting = peer.out_bytes - peer.cleared
            total = self.outflow.total + self.outflow.sent_since
            if peer.unread_cap < self.outflow.limit or self.outflow.full():
                raise LimitError(f"{max(waiting, 0) >> 20} MiB sent to this connection are still unread, and the "
                                 f"dispatcher holds {total >> 20} MiB unread for all its peers (server.max_unread_total: "
                                 f"{self.outflow.total_limit >> 20} MiB): read what you were sent, or try again later")
            raise LimitError(f"{waiting >> 20} MiB sent to this connection are still unread (server.max_unread: "
                             f"{self.outflow.limit >> 20} MiB): read them before asking for more")

    def over_unread(self, peer: Peer) -> bool:
        """May ``peer`` be sent no more for now (zq.server.outflow)? Over its own limit, or
        squeezed, or the dispatcher is full; the total is reckoned first when it is due."""
        outflow = self.outflow
        if (outflow.sent_since <= outflow.quiet_until and peer.unread_cap == UNSQUEEZED
                and peer.out_bytes - peer.cleared <= outflow.limit):
            return False  # the common case: nothing due, not full, within its own limit
        how = outflow.due()
        if how:
            for squeezed in outflow.reckon(self.peers, self.leftovers, how):
                self.note_over(squeezed)  # its dead-peer window starts: it reads, or it is cut off
        if peer.fd >= 0 and outflow.full() and (outflow.brimful() or outflow.unread(peer, force=True) > outflow.allowance):
            return True  # full: only peers that read what they are sent are sent more (until brimful)
        return outflow.over(peer)

    def not_reading(self, peer_id: bytes) -> bool:
        """Is this peer over its unread limit (a replay waits for it)?"""
        peer = self.peers.get(peer_id)
        return peer is not None and self.over_unread(peer)

    def pause(self, peer: Peer, d, first: bool = False) -> None:  # type: ignore[no-untyped-def]
        """Hold a delivery for a peer that is not reading: its bookmarks, not its bytes.
        ``first``: the rest of one being resumed, which goes before what waits after it."""
        if peer.paused is None:
            peer.paused = collections.deque()
            self.paused_peers.add(peer.peer_id)
            self.note_over(peer)
        if first:
            peer.paused.appendleft(d)
        else:
            peer.paused.append(d)
        self.outflow.paused_deliveries += 1

    def note_over(self, peer: Peer) -> None:
        """``peer`` was found over its unread limit: it is cut off if it stays there,
        reading nothing, for its dead-peer window (``watch_unread``)."""
        if not peer.stalled_since:
            peer.stalled_since = wall_ms()
            peer.window_cleared = peer.cleared
        self.over_peers.add(peer.peer_id)

    def may_answer_stranger(self, peer_id: bytes) -> bool:
        """May a connection with no session be answered once more? Its answers (an ERROR
        each) are counted nowhere else and it may never read them: after
        ``STRANGER_ANSWERS_MAX`` it is not answered, and its TCP connection is shut."""
        entry = self.strangers.get(peer_id)
        if entry is None:
            fd = self.taking_fd
            address = outflow_peer_address(fd) if fd >= 0 else None
            entry = self.strangers[peer_id] = [0, fd, address]
            if len(self.strangers) > self.config.max_connections:
                del self.strangers[next(iter(self.strangers))]
        entry[0] += 1
        if entry[0] <= STRANGER_ANSWERS_MAX:
            return True
        if entry[0] == STRANGER_ANSWERS_MAX + 1:
            self.strangers_silenced += 1
            log.warning("a connection with no session was answered %d times: not answered again, and shut",
                        STRANGER_ANSWERS_MAX)
            if entry[1] >= 0 and entry[2] is not None:
                outflow_shut_down(entry[1], entry[2])
        return False

    def watch_unread(self, now: int) -> None:
        """Every heartbeat: cut off the peers that have read nothing for their dead-peer
        window while over the limit; forget the ones back under it; and forget the ended
        sessions whose connection is gone or has read what it held."""
        dead_after = self.config.heartbeat_ms * self.config.heartbeat_liveness
        for peer_id in list(self.over_peers):
            peer = self.peers.get(peer_id)
            if peer is None:
                self.over_peers.discard(peer_id)
            elif not self.outflow.over(peer) and peer.paused is None:
                self.over_peers.discard(peer_id)  # under its limit, nothing waiting for it: done
                peer.stalled_since = 0
            elif not peer.stalled_since:
                # It read a quarter of the limit, or all that waited went: a new window. (Dipping
                # under the limit while deliveries wait is not enough: each dip let one more
                # frame go, and a peer reading a trickle was never cut off.)
                peer.stalled_since = now
                peer.window_cleared = peer.cleared
            elif now - peer.stalled_since > dead_after:
                self.cut_off(peer_id, peer, now)
        for peer_id, gone in list(self.leftovers.items()):
            if self.outflow.unread(gone, force=True) <= 0 or gone.fd < 0:
                del self.leftovers[peer_id]

    def send_after_deliveries(self, peer_id: bytes, frame: bytes) -> None:
        """A frame that must not overtake the peer's deliveries (a revoke, a claim's answer)."""
        peer = self.peers.get(peer_id)
        if peer is not None and peer.paused is not None:
            peer.paused.append(frame)
        else:
            self.send(peer_id, frame)

    def resume_paused(self, now: int) -> None:
        """Send what waits for peers that have read since (``watch_unread`` cuts off the
        ones that do not)."""
        for peer_id in list(self.paused_peers):
            peer = self.peers.get(peer_id)
            if peer is None or peer.paused is None:
                self.paused_peers.discard(peer_id)
                continue
            waiting = peer.paused
            while waiting and not self.over_unread(peer):
                item = waiting.popleft()
                if type(item) is bytes:
                    self.send(peer_id, item)
                else:
                    self.send_deliveries(peer_id, item, resumed=True)
                if peer_id not in self.peers:
                    break  # dropped while sending
            if not waiting:
                peer.paused = None
                peer.stalled_since = 0
                self.paused_peers.discard(peer_id)

    def cut_off(self, peer_id: bytes, peer: Peer, now: int) -> None:
        waiting = peer.out_bytes - peer.cleared
        log.warning("peer %s (%s) read nothing for %d ms with %d MiB unread (server.max_unread %d MiB): cut off",
                    peer.consumer, peer.name, now - peer.stalled_since, waiting >> 20, self.outflow.limit >> 20)
        self.outflow.cut(peer)
        self.drop_peer(peer_id, now)

    def heartbeat(self, now: int) -> None:
        self.next_heartbeat_ms = now + self.config.heartbeat_ms
        if self.security is not None:
            if self.reload_requested:
                self.reload_requested = False
                self.security.reloads += 1
                self.reread_rules()
                self.security.reload()
                self.recheck_sessions(now)
            elif self.security.reload_if_changed():
                self.recheck_sessions(now)
        self.samples.append((now, self.totals()))
        if self.metrics is not None:
            self.snapshot = self.stats(now, limit=0)  # read by the metrics thread; replaced, never mutated
        while len(self.samples) > 1 and now - self.samples[0][0] > 5000:
            self.samples.popleft()
        if self.over_peers or self.leftovers:
            self.watch_unread(now)
        dead_after = self.config.heartbeat_ms * self.config.heartbeat_liveness
        for peer_id, peer in list(self.peers.items()):
            if now - peer.last_heard_ms > dead_after:
                log.info("peer %s (%s) silent for %d ms: declared dead", peer.consumer, peer.name, now - peer.last_heard_ms)
                self.drop_peer(peer_id, now)
            else:
                self.send(peer_id, wire.HEARTBEAT_FRAME)

    def drop_peer(self, peer_id: bytes, now: int) -> None:
        peer = self.peers.pop(peer_id, None)
        if peer is not None:
            for sub in peer.subs:
                self.claims.pop(sub_key(peer, sub), None)
            self.replayer.drop_peer(peer_id)
            self.confirmations.drop_peer(peer_id)
            if peer.bounds_waiting:
                self.bounds_waiting = [b for b in self.bounds_waiting if b[0] != peer_id]
            if peer.key is not None:
                self.quotas.closed(peer.key, peer_id)
            if peer.paused is not None:
                peer.paused = None
                self.paused_peers.discard(peer_id)
            self.over_peers.discard(peer_id)
            if peer.fd >= 0 and peer.out_bytes > peer.cleared:
                # Its connection may live on (a BYE, a second HELLO) with what it was sent
                # still unread: a new session on it starts from these counts (``on_hello``).
                self.leftovers[peer_id] = peer
                if len(self.leftovers) > self.config.max_connections:
                    # Forgotten, its bytes would be counted nowhere (and a new session on it
                    # would start afresh): its connection is shut instead.
                    oldest = self.leftovers.pop(next(iter(self.leftovers)))
                    self.outflow.shut_leftovers += 1
                    if oldest.fd >= 0:
                        outflow_shut_down(oldest.fd, oldest.address)
            if self.snapshots.open:
                self.snapshots.drop_peer(peer_id)
            self.engine.disconnect(peer.consumer, now)

    # ----------------------------------------------------------- upkeep

    def retention(self, now: int) -> None:
        self.next_retention_ms = now + RETENTION_INTERVAL_MS
        self.snapshots.expire(now)
        try:
            self.journal.trim(self.engine.min_recovery_point(), now - self.config.retention_ms)
            self.journal.reader_check()
        except JournalError as exc:
            log.error("retention failed: %s", exc)

    def journal_failed(self, exc: JournalError, now: int) -> None:
        """A commit failed: keep everything staged and try again soon (see commit_and_send)."""
        cause = self.journal_cause(exc)
        if self.journal_down is None:
            log.error("%s: publishing paused, retrying every %d ms (%s)", cause, JOURNAL_RETRY_MS, exc)
            self.journal_down_since = now
            self.journal_failures += 1
        self.journal_down = cause
        self.journal_retry_ms = now + JOURNAL_RETRY_MS

    def journal_cause(self, exc: JournalError) -> str:
        """Name the cause an operator can act on: a full disk says so."""
        try:
            free = shutil.disk_usage(self.config.data).free
        except OSError:
            free = None
        if free is not None and free < JOURNAL_FULL_BYTES or "No space" in str(exc) or "MDB_MAP_FULL" in str(exc):
            return f"journal disk full ({self.config.data}: {free if free is not None else '?'} bytes free)"
        return f"journal not writable ({exc})"


LOCAL_ID_BYTES = 264  # an in-process session's id: longer than any ROUTER routing id (1..255 bytes)


@dataclass
class Held:
    """The part of a delivery that waits for its peer to read (``Dispatcher.pause``)."""

    sub_id: str
    seqs: list[int]
    deliveries: list[int]


def frame_fd(frame: zmq.Frame) -> int:
    """The file descriptor of the connection ``frame`` came by; -2 when it has none
    (inproc://, which libzmq refuses to say)."""
    try:
        return int(frame.get(_SRCFD))
    except zmq.ZMQError:
        return -2


def local_link_id(serial: int) -> bytes:
    return (b"\x00zq-local" + serial.to_bytes(8, "big")).ljust(LOCAL_ID_BYTES, b"\x00")

