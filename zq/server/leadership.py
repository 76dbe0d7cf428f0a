"""What a cluster's leader must keep asking while it serves (``zq.server.cluster``).

``LeaderDuty`` is the loop's view of the cluster, called in the loop thread: may it
serve (its ZooKeeper lease is good, the connection not suspended, no newer epoch
seen), which standbys are in sync (a standby joins when it has caught up and leaves
after ``replica_lag`` without catching up; every change a compare-and-set in
ZooKeeper, made *before* a confirmation may go without that standby), and how far the
in-sync standbys have synced: replicated confirmations wait for every in-sync standby
and for at least ``max(replicas_ack, min_insync)`` of them, so whichever in-sync
standby takes over has every confirmed record.

Whose word counts: a standby's position only once ZooKeeper vouches for the node it
names (``proven``: the node is listed and the BOUNDS carries the token ZooKeeper holds
for it); a claimed newer epoch only once ZooKeeper's state shows it
(``newer_epoch_claimed``). Any client can send BOUNDS.
"""

from __future__ import annotations

import logging

from zq.server.config import Config
from zq.server.election import ClusterState, Coordinator
from zq.server.sessions import Peer

log = logging.getLogger("zq.cluster")

ISR_CHECK_MS = 100  # how often the leader looks at its standbys' progress
ISR_JOIN_MS = 1000  # a standby joins the in-sync set if it caught up this recently
HANDOVER_MS = 5000  # a clean stop waits at most this long for the in-sync standbys


class LeaderDuty:
    """What the leader's loop asks of the cluster (called in the loop thread)."""

    def __init__(self, coord: Coordinator, state: ClusterState, config: Config, now_ms: int) -> None:
        assert config.cluster is not None
        self.coord = coord
        self.epoch = state.epoch
        self.node = config.cluster.node
        self.isr: set[str] = set(state.isr)  # as ZooKeeper has it (this node included)
        # Whom confirmations wait for: the set, and while a change is being written both
        # the old and the new members (a joining standby counts before ZooKeeper says so,
        # a leaving one until it has).
        self.waited_for: set[str] = set(self.isr)
        self.deposed = False  # a newer epoch is known here
        self.pending = False  # a change of the in-sync set is being written
        self.next_check_ms = 0
        self.started_ms = now_ms
        self.caught_up_ms: dict[str, int] = {}  # standby node -> when it last held everything
        self.lag_ms = config.cluster.replica_lag_ms
        self.need = max(config.replicas_ack, config.cluster.min_insync) if config.replicas_ack else 0
        self.wake = lambda: None  # set by the server: wake its loop (a change written)
        # A clean stop (SIGTERM): confirmations wait for the in-sync standbys from then
        # on, and the leader stops once they hold everything it has (or HANDOVER_MS has
        # passed): with replicas_ack = 0 too, nothing it confirmed is left behind.
        self.handing_over = False
        self.handover_end = -1
        self.handover_until_ms = 0
        self.stop_server = lambda: None
        self.unproven = 0  # standby positions not counted: the node was not proven
        coord.read_proofs_soon()

    def proven(self, node: str, proof: str) -> bool:
        """Does this BOUNDS come from the node it names? (``Coordinator.proven``.)"""
        if self.coord.proven(node, proof):
            return True
        self.unproven += 1
        return False

    def newer_epoch_claimed(self, epoch: int) -> None:
        """A BOUNDS named a newer epoch than this leader's: step down if ZooKeeper says so."""
        self.coord.check_epoch(self.epoch, epoch, self.depose)

    def depose(self) -> None:
        self.deposed = True
        self.wake()

    def serving(self) -> bool:
        return not self.deposed and self.coord.serving()

    def standby_reported(self, peer: Peer, position: int, next_seq: int, now: int) -> None:
        """A standby's BOUNDS: it has caught up if it holds what the journal had at its
        previous report (a stream never lets it reach the very end)."""
        if position >= peer.prev_end:
            self.caught_up_ms[peer.node] = now
        peer.prev_end = next_seq

    def replicated_upto(self, peers: dict[bytes, Peer], next_seq: int) -> int:
        """Every record below this is synced on every in-sync standby (0: too few are)."""
        if len(self.isr - {self.node}) < self.need:
            return 0
        members = self.waited_for - {self.node}
        positions: dict[str, int] = {}
        for p in peers.values():
            if p.node in members:
                positions[p.node] = max(positions.get(p.node, 0), p.replica_position)
        return min((positions.get(n, 0) for n in members), default=next_seq)

    def lag_of(self, node: str, now: int) -> int:
        return now - self.caught_up_ms.get(node, self.started_ms)

    def hand_over(self) -> None:
        """Stop cleanly, leaving nothing confirmed behind (any thread; see ``tick``)."""
        self.handing_over = True
        self.wake()

    def tick(self, peers: dict[bytes, Peer], now: int, next_seq: int) -> None:
        """Keep the in-sync set: add standbys that caught up, drop those that lag; end a
        clean stop once the in-sync standbys hold everything."""
        if self.handing_over:
            if self.handover_end < 0:
                self.handover_end, self.handover_until_ms = next_seq, now + HANDOVER_MS
                log.warning("stopping: waiting (at most %d ms) for the in-sync standbys to hold bookmark %d",
                            HANDOVER_MS, next_seq)
            if self.replicated_upto(peers, next_seq) >= self.handover_end or now >= self.handover_until_ms:
                self.handing_over = False  # (once)
                self.stop_server()
            return
        if self.pending or now < self.next_check_ms or self.deposed:
            return
        self.next_check_ms = now + ISR_CHECK_MS
        connected = {p.node for p in peers.values() if p.node}
        want = {self.node}
        for n in self.isr - {self.node}:
            if self.lag_of(n, now) <= self.lag_ms:
                want.add(n)
        for n in connected - self.isr:
            if now - self.caught_up_ms.get(n, -10**12) <= ISR_JOIN_MS:
                want.add(n)
        if want == self.isr:
            return
        self.pending = True
        gone, joined = sorted(self.isr - want), sorted(want - self.isr)
        log.info("in-sync set: %s%s", f"-{gone} " if gone else "", f"+{joined}" if joined else "")

        self.waited_for = self.isr | want

        def done(ok: bool) -> None:
            if ok:
                self.isr = want
            self.waited_for = set(self.isr)
            if not ok:
                st = self.coord.state
                if st is not None and st.epoch != self.epoch:
                    self.deposed = True
            self.pending = False
            self.wake()

        self.coord.set_isr(sorted(want), self.epoch, done)

    def stats(self, peers: dict[bytes, Peer], now: int) -> dict:
        return {"role": "leader", "node": self.node, "epoch": self.epoch, "isr": sorted(self.isr),
                "serving": self.serving(), "need_insync": self.need, "unproven": self.unproven,
                "lag_ms": {n: self.lag_of(n, now) for n in sorted(self.isr | set(self.caught_up_ms)) if n != self.node}}
