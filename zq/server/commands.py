"""What the dispatcher does with each command: one handler per command type, and the
table from type to handler (``HANDLERS``), so adding a command is one Struct in
``zq.wire``, one function here and one entry in the table.

Every handler has the same shape, ``(server, peer_id, peer, cmd, now)``, with ``cmd``
typed as its own command. The loop looks the handler up by the frame's type and calls
it inside the safety net: a handler raises ``ZqError`` for a bad request (answered as
an ERROR naming the problem), and anything else is answered as ``internal`` and
counted. Replies are held until the iteration's commit (``Server.reply``).

``Commands`` is a mixin of ``zq.server.loop.Server``: the attributes below are the
loop's, declared here for the type checker; this module does not import the loop.
"""

from __future__ import annotations

import collections
import heapq
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from zq import wire
from zq.core import delaying, limits, transactions
from zq.core.engine import Engine
from zq.core.errors import (
    JournalError,
    LimitError,
    NotEntitledError,
    NotLeaderError,
    ProtocolError,
    UnknownSubscriptionError,
    ZqError,
)
from zq.core.manage import BulkCursor
from zq.journal.lmdb_journal import LmdbJournal
from zq.server import admin
from zq.server.config import NODE_NAME_RE, Config
from zq.server.held import HeldConfirmations
from zq.server.outflow import Outflow
from zq.server.quotas import KeyQuotas
from zq.server.ranges import RangeReader
from zq.server.replay import Replayer
from zq.server.security import Rights, Security
from zq.server.security import check as check_rights
from zq.server.sessions import Peer, check_sub_id, sub_key
from zq.server.snapshots import Snapshots
from zq.server.trust import STANDBY_SECRET_ENV, same_secret

if TYPE_CHECKING:
    from zq.server.leadership import LeaderDuty

log = logging.getLogger("zq.server")

SERVER_NAME = "zq/0.1.0"
INTERNAL = "internal"  # error code of the safety net: a bug in zq, reported and survived
CLAIM_WAIT_MAX_MS = limits.CLAIM_WAIT_MS_MAX  # longest long poll a claim may ask for
BOUNDS_WAIT_MAX_MS = 60_000  # longest a standby's BOUNDS may wait for the journal to grow
PEEK_BYTES_MAX = 4 * 1024 * 1024  # payload and header bytes in one PEEK answer (then it stops early)
BOUNDS_WAITING_PER_PEER = 4  # a standby waits with one at a time

TRANSACTIONS_PER_FRAME_MAX = 1024  # in one TXS (each costs the loop up to ~50 us, answered or refused)
NEW_QUEUES_PER_FRAME_MAX = 16  # output topics no queue takes yet, in one TX or TXS: each would make a queue


def check_output_ids(outputs: list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]]) -> None:
    """An id a client gives is never one the dispatcher derives (``zq:...``): one given in
    advance would have the dedup window drop the stage's real output (and answer it
    committed), by a key that may only publish to the topic."""
    for _, items in outputs:
        for _, _, msg_id in items:
            if msg_id is not None and msg_id.startswith(transactions.DERIVED_PREFIX):
                raise ProtocolError(f"message ids starting {transactions.DERIVED_PREFIX!r} are the dispatcher's "
                                    "(the ids it derives for transactions' outputs)")


# Request -> (entitlement, the field naming what it touches). Admin ops are checked by name.
ENTITLEMENT_OF: dict[type, tuple[str, str]] = {
    wire.Publish: ("publish", "topic"),
    wire.Subscribe: ("consume", "queue"),
    wire.Claim: ("claim", "queue"),
    wire.Peek: ("browse", "queue"),
    wire.QueryCmd: ("browse", "queue"),
    wire.Replay: ("browse", "target"),
    wire.Range: ("browse", "target"),
    wire.Admin: ("admin", "op"),
}


@dataclass
class BulkAction:
    """A purge / move / ack-filter / redrive under way, answered when its last slice is done."""

    peer_id: bytes
    req: int
    bulk: admin.Bulk
    cursor: BulkCursor
    total: int = 0


class Commands:
    """The command handlers (see the module docstring)."""

    # The loop's state that handlers use.
    config: Config
    engine: Engine
    journal: LmdbJournal
    peers: dict[bytes, Peer]
    security: Security | None
    pending_rights: Rights | None
    pending_key: str | None
    quotas: KeyQuotas
    outflow: Outflow
    leftovers: dict[bytes, Peer]
    strangers: dict[bytes, list]
    over_peers: set[bytes]
    asking: Peer | None  # the remote session whose frame is being handled (what it may be shown)
    replayer: Replayer
    ranges: RangeReader
    claims: dict[str, tuple[bytes, int, int]]
    claim_dues: list[tuple[int, str, int]]
    confirmations: HeldConfirmations
    bounds_waiting: list[tuple[bytes, int, int, int, int]]
    bounds_wake_ms: int
    bulk_actions: collections.deque[BulkAction]
    journal_down: str | None
    internal_errors: int
    cluster: LeaderDuty | None
    snapshots: Snapshots
    replicate_after_drain: list[tuple[bytes, bytes]]  # answers held for the standbys once the step's records are numbered

    if TYPE_CHECKING:  # the loop's methods that handlers use (only declared: the MRO must find the loop's)
        def reply(self, peer_id: bytes, msg: object, durable: bool = False) -> None: ...
        def send(self, peer_id: bytes, frame: bytes) -> bool: ...
        def drop_peer(self, peer_id: bytes, now: int) -> None: ...
        def note_time(self, what: str, took_ms: float, who: bytes) -> None: ...
        def configured_queue(self, name: str) -> bool: ...
        def hold_for_replicas(self, peer_id: bytes, frame: bytes, bookmarks: list[int]) -> None: ...
        def stats(self, now: int, names: list[str] | None = None, limit: int = ...) -> dict: ...
        @property
        def epoch(self) -> int: ...

    # ------------------------------------------------------- entitlements

    def entitled(self, peer: Peer | None, cmd: Any, user: str | None) -> None:
        """With security on: may this client's key make this request? (Raises if not.)"""
        assert self.security is not None
        t = type(cmd)
        if t is wire.Hello:  # a second HELLO on a connection keeps the key it has
            known = peer.rights if peer is not None and user is None else None
            self.pending_rights = known or self.security.rights_of(user)
            self.pending_key = user or (peer.key if peer is not None else None)
            return
        rights = peer.rights if peer is not None else None
        if rights is None:
            raise NotEntitledError("no entitlements for this connection")
        kind_name = ENTITLEMENT_OF.get(t)
        if kind_name is not None:
            kind, field_name = kind_name
            check_rights(rights, kind, getattr(cmd, field_name) or "*")
        elif t is wire.Transact:  # it publishes: to each of its outputs' topics (its settle is of its own leases)
            for topic, _ in cmd.outputs:
                check_rights(rights, "publish", topic or "*")
        # (TXS: each transaction's outputs are checked on their own, in ``on_transact_many``.)

    # ------------------------------------------------------------ sessions

    def on_hello(self, peer_id: bytes, peer: Peer | None, cmd: wire.Hello, now: int) -> None:
        if cmd.version != wire.PROTOCOL_VERSION:
            raise ProtocolError(f"protocol version {cmd.version} not supported (server speaks {wire.PROTOCOL_VERSION})")
        if peer is not None:
            self.drop_peer(peer_id, now)  # a second HELLO restarts the session
        elif len(self.peers) >= self.config.max_connections:
            raise LimitError(f"too many connections (server.max_connections = {self.config.max_connections})")
        key, rights = self.pending_key, self.pending_rights  # (a remote key's, with security on; else None)
        if key is not None and rights is not None:
            self.quotas.check_session(key, rights)
        fresh = self.peers[peer_id] = Peer(peer_id, cmd.name[:200], now)
        fresh.notices = wire.NOTICE in cmd.accepts
        self.strangers.pop(peer_id, None)  # (answered while it had no session: it has one now)
        old = self.leftovers.pop(peer_id, None)
        if old is not None:
            self.outflow.inherit(fresh, old)
            if fresh.stalled_since:
                self.over_peers.add(peer_id)  # its dead-peer window goes on
        if key is not None and rights is not None:
            fresh.rights, fresh.key = rights, key
            self.quotas.opened(key, peer_id)
        self.reply(peer_id, wire.Welcome(wire.PROTOCOL_VERSION, SERVER_NAME, self.config.heartbeat_ms,
                                         self.config.max_message_bytes, self.epoch))

    def on_heartbeat(self, peer_id: bytes, peer: Peer, cmd: wire.Heartbeat, now: int) -> None:
        pass  # hearing it was the point (``receive`` noted the time)

    def on_bye(self, peer_id: bytes, peer: Peer, cmd: wire.Bye, now: int) -> None:
        self.drop_peer(peer_id, now)

    # ----------------------------------------------------------- publishing

    def on_publish(self, peer_id: bytes, peer: Peer, cmd: wire.Publish, now: int) -> None:
        if self.journal_down is not None:  # before the engine: nothing is enqueued that cannot be stored
            raise JournalError(f"{self.journal_down}: not stored, publishing resumes once the journal takes writes")
        if len(cmd.messages) > limits.PUBLISH_BATCH_MAX:
            raise LimitError(f"at most {limits.PUBLISH_BATCH_MAX} messages per publish frame")
        check_output_ids([(cmd.topic, cmd.messages)])
        self.confirmations.check_room(peer_id)
        if peer.key is not None and not self.engine.route(cmd.topic) and cmd.topic not in self.engine.queues:
            self.quotas.check_new_queue(peer)  # (this publish would create a queue)
        not_before = cmd.not_before_ms
        if cmd.delay_ms:
            if not 0 < cmd.delay_ms <= limits.DURATION_MS_MAX:
                raise ProtocolError(f"a publish's delay must be 0..{limits.DURATION_MS_MAX} ms")
            not_before = max(not_before, now + cmd.delay_ms)
        deadline = cmd.expires_at_ms
        if cmd.ttl_ms:  # counted from when the dispatcher takes the frame; the sooner of the two wins
            if not 0 < cmd.ttl_ms <= limits.DURATION_MS_MAX:
                raise ProtocolError(f"a publish's ttl must be 0..{limits.DURATION_MS_MAX} ms")
            deadline = min(deadline, now + cmd.ttl_ms) if deadline else now + cmd.ttl_ms
        bookmarks = self.engine.publish_many(cmd.topic, cmd.messages, now, self.config.max_message_bytes, not_before,
                                             deadline)
        peer.published += len(bookmarks)
        full = self.engine.withheld(cmd.topic)
        if full:  # flow-control: the confirmation waits until those queues drain
            self.confirmations.hold_flow(peer_id, wire.encode(wire.Confirm(cmd.req, bookmarks)), full)
            return
        if self.config.replicas_ack or self.cluster is not None and self.cluster.handing_over:  # replicated: it waits for the standbys too
            self.hold_for_replicas(peer_id, wire.encode(wire.Confirm(cmd.req, bookmarks)), bookmarks)
            return
        self.reply(peer_id, wire.Confirm(cmd.req, bookmarks), durable=True)

    # -------------------------------------------------------- subscriptions

    def check_room(self, peer: Peer) -> None:
        if len(peer.subs) >= self.config.max_subscriptions_per_connection:
            raise LimitError("too many subscriptions on this connection "
                             f"(server.max_subscriptions_per_connection = {self.config.max_subscriptions_per_connection})")
        self.quotas.check_subscription(peer, self.peers)

    def check_queue_room(self, peer: Peer, queue: str) -> None:
        """A keyed session naming a queue that does not exist yet (a subscription or
        claim creates it): within its key's max_queues?"""
        if peer.key is not None and queue not in self.engine.queues:
            self.quotas.check_new_queue(peer)

    def on_subscribe(self, peer_id: bytes, peer: Peer, cmd: wire.Subscribe, now: int) -> None:
        check_sub_id(cmd.sub)
        self.check_room(peer)
        if cmd.sub in peer.subs:
            raise ProtocolError(f"subscription {cmd.sub!r} already open on this connection")
        self.check_queue_room(peer, cmd.queue)
        backlog = self.engine.subscribe(sub_key(peer, cmd.sub), cmd.queue, peer.consumer, cmd.max_backlog, now,
                                        filter=cmd.filter, consumer_name=peer.name, reclaimable=cmd.reclaimable)
        peer.subs.add(cmd.sub)
        q = self.engine.queues.get(cmd.queue)
        header = q.settings.group_header if q is not None else "group"
        self.reply(peer_id, wire.Subscribed(cmd.req, cmd.sub, backlog, header))

    def on_unsubscribe(self, peer_id: bytes, peer: Peer, cmd: wire.Unsubscribe, now: int) -> None:
        if self.replayer.close(sub_key(peer, cmd.sub)):
            self.reply(peer_id, wire.Reply(cmd.req, None))
            return
        if cmd.sub not in peer.subs:
            raise ProtocolError(f"no subscription {cmd.sub!r} on this connection")
        peer.subs.discard(cmd.sub)
        self.engine.unsubscribe(sub_key(peer, cmd.sub), now)
        self.reply(peer_id, wire.Reply(cmd.req, None))

    def on_claim(self, peer_id: bytes, peer: Peer, cmd: wire.Claim, now: int) -> None:
        check_sub_id(cmd.sub)
        if cmd.sub not in peer.subs:
            self.check_room(peer)
        key = sub_key(peer, cmd.sub)
        if key in self.claims:
            raise ProtocolError(f"claim {cmd.sub!r} already open; wait for its answer")
        if not 0 <= cmd.wait_ms <= CLAIM_WAIT_MAX_MS:  # (was cut to 60 s without a word)
            raise ProtocolError(f"a claim's wait_ms must be 0..{CLAIM_WAIT_MAX_MS}, got {cmd.wait_ms}")
        wait_ms = cmd.wait_ms
        self.check_queue_room(peer, cmd.queue)
        self.engine.claim(key, cmd.queue, peer.consumer, cmd.limit, cmd.lease_ms, now,
                          destructive=cmd.destructive, filter=cmd.filter, consumer_name=peer.name)
        peer.subs.add(cmd.sub)
        self.claims[key] = (peer_id, cmd.req, now + wait_ms)
        heapq.heappush(self.claim_dues, (now + wait_ms, key, cmd.req))

    def end_due_claims(self, now: int) -> None:
        """Claims whose wait ran out answer with nothing. Only those are looked at (a
        heap by deadline; an entry of a claim answered or gone meanwhile is skipped):
        100,000 open long polls once cost every iteration a scan of them all."""
        dues, claims = self.claim_dues, self.claims
        while dues and dues[0][0] <= now:
            due, key, req = heapq.heappop(dues)
            open_claim = claims.get(key)
            if open_claim is None or open_claim[1] != req or open_claim[2] != due:
                continue  # answered, dropped, or a later claim of the same name
            del claims[key]
            self.engine.end_claim(key)
            self.send(open_claim[0], wire.encode(wire.Reply(req, {"count": 0})))

    def next_claim_due(self) -> int | None:
        """The earliest deadline of an open claim (stale heap entries are cleared here)."""
        dues, claims = self.claim_dues, self.claims
        while dues:
            due, key, req = dues[0]
            open_claim = claims.get(key)
            if open_claim is not None and open_claim[1] == req and open_claim[2] == due:
                return due
            heapq.heappop(dues)
        return None

    # ------------------------------------------------------------- settling

    def settle(self, peer_id: bytes, peer: Peer, cmd: wire.Ack | wire.Cancel | wire.Expire | wire.Extend, op: str,
               now: int, extra_ms: int = 0, delay_ms: int = -1, error: str = "") -> None:
        """Apply a settle, fenced by its epochs; tell the client what was not applied:
        a REFUSED per result (``lost``, ``done``, ``unknown``), or with ``req`` one
        REPLY giving every bookmark's result, ``ok`` included. A frame names at most
        ``ACK_BATCH_MAX`` bookmarks (a subscription holds at most ``BACKLOG_MAX``): one
        frame of millions held the loop for seconds and its REFUSED echoed them all."""
        if len(cmd.bookmarks) > limits.ACK_BATCH_MAX or len(cmd.epochs) > limits.ACK_BATCH_MAX:
            raise LimitError(f"at most {limits.ACK_BATCH_MAX} bookmarks in one {op}")
        if cmd.sub not in peer.subs:
            if op == "ack" and not cmd.req and self.replayer.credit(sub_key(peer, cmd.sub), len(cmd.bookmarks)):
                return  # a replay's client took these: room for more
            results = {"unknown-subscription": cmd.bookmarks}
        else:
            results = self.engine.settle(op, sub_key(peer, cmd.sub), cmd.bookmarks, cmd.epochs, now, extra_ms, delay_ms,
                                         error)
        if cmd.req:
            not_ok = {seq for seqs in results.values() for seq in seqs}
            answer = {"ok": [seq for seq in cmd.bookmarks if seq not in not_ok], **results}
            self.reply(peer_id, wire.Reply(cmd.req, answer))
            return
        for reason, seqs in results.items():
            self.reply(peer_id, wire.Refused(cmd.sub, op, seqs, reason))

    def on_ack(self, peer_id: bytes, peer: Peer, cmd: wire.Ack, now: int) -> None:
        self.settle(peer_id, peer, cmd, "ack", now)

    def on_cancel(self, peer_id: bytes, peer: Peer, cmd: wire.Cancel, now: int) -> None:
        self.settle(peer_id, peer, cmd, "cancel", now, delay_ms=cmd.delay_ms, error=cmd.error)

    def on_expire(self, peer_id: bytes, peer: Peer, cmd: wire.Expire, now: int) -> None:
        self.settle(peer_id, peer, cmd, "expire", now)

    def on_extend(self, peer_id: bytes, peer: Peer, cmd: wire.Extend, now: int) -> None:
        self.settle(peer_id, peer, cmd, "extend", now, cmd.ms)

    def on_transact(self, peer_id: bytes, peer: Peer, cmd: wire.Transact, now: int) -> None:
        """Settle and publish in one commit (``zq.core.transactions``), answered once:
        REPLY ``{committed: true, published}`` when all of it happened, with the
        CONFIRM's promise (after the commit, the standbys and flow control as a PUBLISH
        is confirmed); ``{committed: false, <result>: [...], held}`` when an input was
        not a live delivery and nothing happened; an ERROR (nothing happened) for a bad
        output, or one its queue refuses."""
        self.check_transactions(peer, cmd.sub, [cmd.outputs])
        check_output_ids(cmd.outputs)
        answer = self.transact(peer, sub_key(peer, cmd.sub), cmd.op, cmd.bookmarks, cmd.epochs, cmd.outputs, now,
                               cmd.delay_ms, cmd.error)
        if answer.get("committed"):
            self.answer_committed(peer_id, wire.Reply(cmd.req, answer), (topic for topic, _ in cmd.outputs))
        else:
            self.reply(peer_id, wire.Reply(cmd.req, answer))

    def on_transact_many(self, peer_id: bytes, peer: Peer, cmd: wire.TransactMany, now: int) -> None:
        """Independent transactions of one subscription in one frame, each all or nothing
        (``on_transact``; its rights checked on its own), answered by one REPLY
        ``{results}`` with each one's answer (``{error, message}`` for one that raised),
        held as a CONFIRM is while any of them published."""
        if len(cmd.txs) > TRANSACTIONS_PER_FRAME_MAX:
            raise LimitError(f"at most {TRANSACTIONS_PER_FRAME_MAX} transactions in one frame")
        if sum(len(tx[1]) for tx in cmd.txs) > limits.ACK_BATCH_MAX:
            raise LimitError(f"at most {limits.ACK_BATCH_MAX} bookmarks in one frame")
        self.check_transactions(peer, cmd.sub, [tx[3] for tx in cmd.txs])
        key = sub_key(peer, cmd.sub)
        results: list[dict] = []
        reached: set[str] = set()
        for op, bookmarks, epochs, outputs, delay_ms, error in cmd.txs:
            try:
                if peer.rights is not None:  # (a remote key's; checked per transaction: one refused is one refused)
                    for topic, _ in outputs:
                        check_rights(peer.rights, "publish", topic or "*")
                check_output_ids(outputs)
                answer = self.transact(peer, key, op, bookmarks, epochs, outputs, now, delay_ms, error)
            except ZqError as exc:
                results.append({"error": exc.code, "message": str(exc)[:1024]})
                continue
            except Exception as exc:  # noqa: BLE001 -- the safety net, per transaction: the others' answers stand
                self.internal_errors += 1
                log.exception("internal error in a transaction of %s", peer_id.hex()[:64])
                results.append({"error": INTERNAL, "message": f"internal error ({type(exc).__name__})"})
                continue
            if answer.get("committed"):
                reached.update(topic for topic, _ in outputs)
            results.append(answer)
        if reached:
            self.answer_committed(peer_id, wire.Reply(cmd.req, {"results": results}), reached)
        else:
            self.reply(peer_id, wire.Reply(cmd.req, {"results": results}))

    def check_transactions(self, peer: Peer, sub: str, outputs: list[list[tuple[str, Any]]]) -> None:
        """Before any transaction of a frame happens: the journal takes writes, the
        subscription is this connection's, a confirmation may be held, and the frame's
        output topics are few: at most ``OUTPUTS_MAX`` distinct, of which at most
        ``NEW_QUEUES_PER_FRAME_MAX`` would make a queue (4,096 made in one step held the
        loop 7 s: routing scans every queue), within the key's ``max_queues``."""
        if self.journal_down is not None:  # before the engine: nothing happens that cannot be stored
            raise JournalError(f"{self.journal_down}: nothing settled or published; try again once the journal "
                               "takes writes")
        if sub not in peer.subs:
            raise UnknownSubscriptionError(f"no subscription {sub!r} on this connection")
        topics = {topic for each in outputs for topic, _ in each}
        if len(topics) > transactions.OUTPUTS_MAX:
            raise LimitError(f"at most {transactions.OUTPUTS_MAX} output topics in one frame")
        if sum(len(items) for each in outputs for _, items in each) > limits.PUBLISH_BATCH_MAX:
            raise LimitError(f"at most {limits.PUBLISH_BATCH_MAX} messages published by one frame")
        self.confirmations.check_room(peer.peer_id)
        new = [t for t in topics if t not in self.engine.queues and not self.engine.routes.covered(t)]
        if len(new) > NEW_QUEUES_PER_FRAME_MAX:
            raise LimitError(f"at most {NEW_QUEUES_PER_FRAME_MAX} output topics no queue takes yet in one frame "
                             f"(each would make a queue): {len(new)} here")
        if new and peer.key is not None:
            self.quotas.check_new_queue(peer, len(new))

    def transact(self, peer: Peer, key: str, op: str, bookmarks: list[int], epochs: list[int],
                 outputs: list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]], now: int, delay_ms: int,
                 error: str) -> dict:
        """One transaction, as its answer (TX's REPLY data)."""
        refused, published = self.engine.transact(key, op, bookmarks, epochs, outputs, now,
                                                  self.config.max_message_bytes, delay_ms, error)
        if refused:
            gone = {seq for seqs in refused.values() for seq in seqs}
            return {"committed": False, **refused, "held": [seq for seq in bookmarks if seq not in gone]}
        peer.published += sum(map(len, published))
        return {"committed": True, "published": published}  # (not the inputs again: the client has them)

    def answer_committed(self, peer_id: bytes, answer: wire.Reply, topics: Iterable[str]) -> None:
        """A transaction's answer promises what a CONFIRM does: after the commit, the
        standbys (``replicas_ack``: every record of the step, its settle too) and the
        flow-controlled queues its outputs reached."""
        full = sorted({name for topic in topics for name in self.engine.withheld(topic)})
        if full:  # flow-control: the answer waits until those queues drain, as a CONFIRM does
            self.confirmations.hold_flow(peer_id, wire.encode(answer), full)
        elif self.config.replicas_ack or self.cluster is not None and self.cluster.handing_over:
            self.replicate_after_drain.append((peer_id, wire.encode(answer)))  # (the settle's events: numbered at the drain)
        else:
            self.reply(peer_id, answer, durable=True)

    def on_release(self, peer_id: bytes, peer: Peer, cmd: wire.Release, now: int) -> None:
        """A reclaimable subscription gives back what it had not started of a REVOKE.
        Nothing is answered: what was not asked for, or ended meanwhile, is ignored."""
        if cmd.sub not in peer.subs:
            raise ProtocolError(f"no subscription {cmd.sub!r} on this connection")
        if len(cmd.bookmarks) + len(cmd.kept) > limits.ACK_BATCH_MAX:
            raise LimitError(f"at most {limits.ACK_BATCH_MAX} bookmarks in one release")
        self.engine.release_revoked(sub_key(peer, cmd.sub), cmd.bookmarks, cmd.epochs, cmd.kept, cmd.kept_epochs, now)

    # -------------------------------------------------------------- reading

    def on_stats(self, peer_id: bytes, peer: Peer, cmd: wire.Stats, now: int) -> None:
        if cmd.queues is not None and len(cmd.queues) > limits.STATS_QUEUES_MAX:
            raise ProtocolError(f"stats names at most {limits.STATS_QUEUES_MAX:,} queues, got {len(cmd.queues):,}")
        self.reply(peer_id, wire.Reply(cmd.req, self.stats(now, cmd.queues)))

    def on_queues(self, peer_id: bytes, peer: Peer, cmd: wire.Queues, now: int) -> None:
        """The queues this session's key may consume or browse (all of them without
        security, or for an in-process session)."""
        rights = peer.rights if self.security is not None and self.asking is peer else None
        self.reply(peer_id, wire.Reply(cmd.req, [msgspec.to_builtins(q.settings) for q in self.engine.queues.values()
                                                 if rights is None or rights.sees(q.name)]))

    def on_peek(self, peer_id: bytes, peer: Peer, cmd: wire.Peek, now: int) -> None:
        """Up to ``limit`` waiting messages, and about ``PEEK_BYTES_MAX`` of them at most:
        10,000 messages with 4 KiB headers made a 50 MB answer that held the loop 220 ms."""
        limit = max(0, min(cmd.limit, 10_000))
        # Only what is committed: a message published earlier in this loop iteration is known
        # to the engine but not yet in the journal (its PEEK failed with a JournalError).
        committed = self.journal.high
        items = [item for item in self.engine.peek(cmd.queue, limit, cmd.filter) if item[0] < committed]
        q = self.engine.queues[cmd.queue]
        header = q.settings.group_header
        out: list[dict] = []
        size = 0
        for r, (_, d) in zip(self.journal.get_messages([seq for seq, _ in items]), items):
            item = {"bookmark": r.seq, "topic": r.topic, "headers": r.headers, "payload": r.payload,
                    "deliveries": d, "ts_ms": r.ts_ms, "group": r.headers.get(header) if header else None}
            due = delaying.due_of(q, r.seq)
            if due is not None:
                item["not_before_ms"] = due  # waits for its retry or its publish's delay
            out.append(item)
            size += len(r.payload) + sum(len(k) + len(v) for k, v in r.headers.items())
            if size >= PEEK_BYTES_MAX:
                break
        self.reply(peer_id, wire.Reply(cmd.req, out))

    def on_query(self, peer_id: bytes, peer: Peer, cmd: wire.QueryCmd, now: int) -> None:
        self.reply(peer_id, wire.Reply(cmd.req, self.engine.query(cmd.queue, cmd.group_by, cmd.aggregates, cmd.filter)))

    def on_bounds(self, peer_id: bytes, peer: Peer, cmd: wire.Bounds, now: int) -> None:
        """A standby's BOUNDS also says where its synced copy is (``position``: what
        replicated confirmations wait for) and may wait for the journal to pass ``after``."""
        if not 0 <= cmd.wait_ms <= BOUNDS_WAIT_MAX_MS:
            raise ProtocolError(f"a bounds wait must be 0..{BOUNDS_WAIT_MAX_MS} ms")
        if not -1 <= cmd.position < 1 << 64 or not -1 <= cmd.after < 1 << 64:
            raise ProtocolError("position and after are bookmarks (or -1)")
        if cmd.position >= 0:
            if self.security is not None:  # a standby's word releases confirmations: only one entitled to copy
                if peer.rights is None:
                    raise NotEntitledError("no entitlements for this connection")
                check_rights(peer.rights, "admin", "journal-tables")
            if cmd.node and not NODE_NAME_RE.fullmatch(cmd.node):
                raise ProtocolError("a standby's node name is 1..64 letters, digits, _ . -")
            if not 0 <= cmd.epoch < 1 << 63:
                raise ProtocolError("an epoch is 0..2^63-1")
            if self.cluster is not None and cmd.epoch > self.cluster.epoch:
                # Fenced at the resource: a standby that knows a newer leader will not
                # copy this one. Only ZooKeeper deposes it, though: anyone can send this.
                self.cluster.newer_epoch_claimed(cmd.epoch)
                raise NotLeaderError(f"epoch {cmd.epoch} is newer than this leader's ({self.cluster.epoch}): "
                                     "it steps down if ZooKeeper says so")
            if cmd.node and peer.node and peer.node != cmd.node:
                raise ProtocolError(f"this session is standby {peer.node!r}: its node name cannot change")
            if self.position_counts(cmd):
                # Never past what exists: a peer cannot claim records that were not written.
                peer.replica_position = max(peer.replica_position, min(cmd.position, self.engine.next_seq))
                if cmd.node:
                    peer.node = cmd.node
                if self.cluster is not None and peer.node:
                    self.cluster.standby_reported(peer, peer.replica_position, self.engine.next_seq, now)
        if cmd.wait_ms and cmd.at_ms is None and self.engine.next_seq <= cmd.after:
            if len(self.bounds_waiting) >= self.config.max_connections:
                raise LimitError("too many waiting bounds requests")
            if peer.bounds_waiting >= BOUNDS_WAITING_PER_PEER:  # (else one peer takes every standby's slot)
                raise LimitError(f"at most {BOUNDS_WAITING_PER_PEER} waiting bounds requests per connection")
            peer.bounds_waiting += 1
            self.bounds_waiting.append((peer_id, cmd.req, cmd.after, now + cmd.wait_ms, self.engine.tables_changes))
            self.bounds_wake_ms = min(self.bounds_wake_ms, now + cmd.wait_ms)
            return
        seq_at = self.journal.seq_at_time(cmd.at_ms) if cmd.at_ms is not None else None
        self.reply(peer_id, wire.Reply(cmd.req, {"next_seq": self.engine.next_seq, "seq_at": seq_at,
                                                 "tables": self.engine.tables_changes, "epoch": self.epoch}))

    def position_counts(self, cmd: wire.Bounds) -> bool:
        """Is this BOUNDS's position a standby's word (``zq.server.trust``)? A cluster
        node's when ZooKeeper holds its ``proof`` for the node it names (not yet, or not
        that: the answer is as usual, the position is ignored); else, with a
        ``standby_secret``, when it is shown (refused otherwise); else, with
        ``[security]``, the key's right (checked already); with none of them it is only
        shown in stats (such a leader has no ``replicas_ack``: config refuses it)."""
        if self.cluster is not None and cmd.node:
            return self.cluster.proven(cmd.node, cmd.proof)
        secret = self.config.cluster_section.standby_secret
        if secret:
            if not same_secret(secret, cmd.proof):
                raise NotEntitledError("a standby's position counts only with the leader's [cluster] standby_secret "
                                       f"(`zq standby` reads it from ${STANDBY_SECRET_ENV})")
            return True
        return self.security is not None or not self.config.replicas_ack

    def on_range(self, peer_id: bytes, peer: Peer, cmd: wire.Range, now: int) -> None:
        if peer.ranges_waiting >= limits.RANGES_WAITING_PER_CONNECTION:
            # Its answers are counted against server.max_unread only once sent: without this,
            # a burst of RANGEs all answered before any is read would pass the limit.
            raise LimitError(f"{peer.ranges_waiting} RANGE requests of this connection are still being answered "
                             f"(at most {limits.RANGES_WAITING_PER_CONNECTION}): read their answers first")
        self.ranges.forward(peer_id, cmd)  # the reader thread answers (zq.server.ranges)
        peer.ranges_waiting += 1

    def on_replay(self, peer_id: bytes, peer: Peer, cmd: wire.Replay, now: int) -> None:
        check_sub_id(cmd.sub)
        info = self.replayer.open(sub_key(peer, cmd.sub), peer_id, cmd)
        self.reply(peer_id, wire.Reply(cmd.req, info))

    # ------------------------------------------------------------ operators

    def on_admin(self, peer_id: bytes, peer: Peer, cmd: wire.Admin, now: int) -> None:
        if peer.key is not None and cmd.op in ("queue-create", "move"):
            self.quotas.check_new_queue(peer)  # (may create a queue; a move only when its target is new: checked anyway)
        result = admin.run(self, peer, cmd.op, cmd.args, now)
        if type(result) is admin.Bulk:
            self.start_bulk(peer_id, cmd.req, result, now)
        else:
            self.reply(peer_id, wire.Reply(cmd.req, result), durable=True)

    def start_bulk(self, peer_id: bytes, req: int, bulk: admin.Bulk, now: int) -> None:
        """Run a bulk action's first slice now; a small queue's answer leaves this iteration."""
        if len(self.bulk_actions) >= limits.BULK_ACTIONS_MAX:
            raise LimitError(f"{limits.BULK_ACTIONS_MAX} purges / moves / ack-filters / redrives are under way; "
                             "try again when one ends")
        action = BulkAction(peer_id, req, bulk, self.engine.bulk_cursor())
        action.total += bulk.step(action.cursor, now)  # errors here are the request's: answered as usual
        if action.cursor.done:
            self.reply(peer_id, wire.Reply(req, action.total), durable=True)
        else:
            self.bulk_actions.append(action)

    def run_bulk(self, now: int) -> None:
        """One slice of the oldest bulk action (they take turns), answered when done."""
        action = self.bulk_actions.popleft()
        started = time.perf_counter()
        try:
            action.total += action.bulk.step(action.cursor, now)
        except ZqError as exc:  # the queue was deleted under it, say
            self.reply(action.peer_id, wire.Error(action.req, exc.code, f"{action.bulk.name} stopped after "
                                                  f"{action.total} messages: {str(exc)[:1900]}"), durable=True)
            return
        except Exception as exc:  # noqa: BLE001 -- the safety net, as for commands
            self.internal_errors += 1
            log.exception("internal error in a slice of %s", action.bulk.name)
            self.reply(action.peer_id, wire.Error(action.req, INTERNAL, f"internal error ({type(exc).__name__}) "
                                                  f"after {action.total} messages; the dispatcher goes on"))
            return
        finally:
            self.note_time(f"Admin({action.bulk.name}) slice", (time.perf_counter() - started) * 1000, action.peer_id)
        if action.cursor.done:
            self.reply(action.peer_id, wire.Reply(action.req, action.total), durable=True)
        else:
            self.bulk_actions.append(action)


# Command type -> handler: the whole of the dispatch. ``tests/adapters`` checks that every
# type the wire decodes from a client has an entry.
Handler = Callable[[Any, bytes, Any, Any, int], None]
HANDLERS: dict[type, Handler] = {
    wire.Ack: Commands.on_ack,
    wire.Publish: Commands.on_publish,
    wire.Heartbeat: Commands.on_heartbeat,
    wire.Hello: Commands.on_hello,
    wire.Subscribe: Commands.on_subscribe,
    wire.Cancel: Commands.on_cancel,
    wire.Expire: Commands.on_expire,
    wire.Extend: Commands.on_extend,
    wire.Release: Commands.on_release,
    wire.Transact: Commands.on_transact,
    wire.TransactMany: Commands.on_transact_many,
    wire.Unsubscribe: Commands.on_unsubscribe,
    wire.Bye: Commands.on_bye,
    wire.Stats: Commands.on_stats,
    wire.Peek: Commands.on_peek,
    wire.Queues: Commands.on_queues,
    wire.Range: Commands.on_range,
    wire.Bounds: Commands.on_bounds,
    wire.Admin: Commands.on_admin,
    wire.Replay: Commands.on_replay,
    wire.Claim: Commands.on_claim,
    wire.QueryCmd: Commands.on_query,
}
