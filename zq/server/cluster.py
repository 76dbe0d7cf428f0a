"""One node of an elected cluster: a standby until ZooKeeper makes it the leader.

Theory of operation
-------------------
``zq serve`` with ``[cluster] zookeeper = ...`` runs a ``Node``. It joins ZooKeeper
(``zq.server.election``) and, while another node leads, is a standby of it: it copies
the leader's journal (``zq.server.standby``) and answers clients on its own endpoint
with where the leader is. All the while it queues for the election lock; holding it,
and named in the in-sync set (or the cluster being new), it writes the next epoch with
a compare-and-set, stops copying, notes the epoch's first bookmark in its journal and
serves, recovering from that journal as after a restart: leases restart on its own
clock, what was in flight goes again (each delivery counted, its cause *consumer
gone*).

While it leads, ``zq.server.leadership.LeaderDuty`` is what the loop asks of the
cluster: may it serve, which standbys are in sync, how far they have synced.

Stepping down: when its session is lost, or ZooKeeper's state shows a newer epoch (a
standby naming one only makes it look), it stops serving, closes its dispatcher and
becomes a standby of the new leader, first truncating what it wrote that the new
leader never had (``zq.journal.replica``). Whose word counts at all: ``zq.server.trust``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import zmq

from zq.core.errors import ZqError
from zq.journal import replica
from zq.journal.lmdb_journal import LmdbJournal
from zq.server.config import Config
from zq.server.election import ClusterState, Coordinator
from zq.server.leadership import LeaderDuty
from zq.server.router import open_router

if TYPE_CHECKING:
    from zq.server.loop import Server
    from zq.server.standby import NotLeader, Standby

log = logging.getLogger("zq.cluster")


class Node:
    """``zq serve`` in a cluster: follow, contend, lead, step down, until ``stop()``."""

    def __init__(self, config: Config, *, context: zmq.Context | None = None) -> None:
        assert config.cluster is not None
        self.config = config
        self.cc = config.cluster
        self.ctx = context or zmq.Context.instance()
        self.stopping = threading.Event()
        self.changed = threading.Event()  # ZooKeeper said something
        self.coord = Coordinator(self.cc.zookeeper, self.cc.path, self.cc.node, self.cc.advertise,
                                 self.cc.session_timeout_ms, on_change=self.changed.set)
        self.server: Server | None = None  # the dispatcher while leading
        self.duty: LeaderDuty | None = None
        self.follower: Standby | None = None  # the standby while following
        self.responder: NotLeader | None = None
        self.terms = 0  # times this node has led

    def stop(self) -> None:
        """SIGTERM: a standby stops; a leader first waits (a few seconds at most) for
        its in-sync standbys to hold everything it has, then stops (a second call: at once)."""
        again = self.stopping.is_set()
        self.stopping.set()
        self.changed.set()
        server, follower, duty = self.server, self.follower, self.duty
        if server is not None:
            if duty is not None and not again:
                duty.hand_over()
            else:
                server.stop()
        if follower is not None:
            follower.stop()

    def run(self) -> None:
        if self.config.security is None:
            log.warning("cluster node %s runs WITHOUT [security]: anyone who reaches a node may publish, consume "
                        "and administer, and can read what the nodes send each other, the tokens that prove a "
                        "standby included; anyone who reaches ZooKeeper can read those tokens and rewrite who "
                        "leads. Keep the nodes and ZooKeeper on a network only they share, or add a [security] "
                        "block (README: \"A cluster: automatic failover\")", self.cc.node)
        self.coord.start()
        try:
            while not self.stopping.is_set():
                state = self.follow_until_elected()
                if state is None:
                    break
                self.lead(state)
        finally:
            if self.responder is not None:
                self.responder.close()
                self.responder = None
            self.coord.release()
            self.coord.stop()

    # ------------------------------------------------------------ following

    def eligible(self, state: ClusterState | None) -> bool:
        """May this node take over? Only an in-sync one (or the first leader of a new cluster)."""
        return state is None or not state.isr or self.cc.node in state.isr

    def follow_until_elected(self) -> ClusterState | None:
        """Be a standby until this node wins the election (returns the new state) or
        is stopped (None)."""
        from zq.keys import client_curve
        from zq.server.standby import HOLD_MIN_MS, NotLeader, Standby

        if self.responder is None:
            # Clients wait here while an election can be under way (the leader's session
            # runs out, then a standby wins): twice the session timeout, 5 s at least.
            self.responder = NotLeader(self.config.bind, "", self.ctx,
                                       router=open_router(self.config, self.ctx), wait_for_leader=True,
                                       heartbeat_ms=self.config.heartbeat_ms,
                                       hold_ms=max(HOLD_MIN_MS, 2 * self.cc.session_timeout_ms))
        follower: Standby | None = None
        restart_at = 0.0
        target = ("", 0)
        thread: threading.Thread | None = None
        try:
            while not self.stopping.is_set():
                if self.coord.lost:
                    self.rejoin()
                st = self.coord.state
                leader = (st.endpoint, st.epoch) if st is not None and st.leader and st.leader != self.cc.node else ("", 0)
                ended = thread is not None and not thread.is_alive() and time.monotonic() >= restart_at
                if leader != target or ended:
                    if follower is not None:
                        follower.stop()
                        assert thread is not None
                        thread.join()
                        follower = self.follower = None
                    target = leader
                    if leader[0]:
                        follower = Standby(leader[0], self.config.data, curve=client_curve(),
                                           context=self.ctx, node=self.cc.node, epoch=leader[1],
                                           proof=self.coord.token)
                        self.follower = follower
                        self.responder.follow(leader[0], follower.state)
                        thread = threading.Thread(target=self.follow, args=(follower,), name="zq-standby", daemon=True)
                        thread.start()
                        restart_at = time.monotonic() + 1.0  # a copy that stops is started again, once a second
                    else:
                        self.responder.follow("", None)
                # Contend (while the leader's session lives, there is nothing to win): the
                # lock, then, in sync, the epoch.
                leader_alive = st is not None and st.leader in self.coord.alive and st.leader != self.cc.node
                if self.eligible(st) and not self.coord.suspended and not leader_alive:
                    journal_epoch = self.journal_epoch(follower)
                    won = self.coord.try_lead(self.eligible, journal_epoch, wait_s=0.2)
                    if won is not None:
                        return won
                self.changed.wait(0.2)
                self.changed.clear()
            return None
        finally:
            if follower is not None:
                follower.stop()
                if thread is not None:
                    thread.join()
            self.follower = None

    def follow(self, follower) -> None:  # type: ignore[no-untyped-def]
        try:
            follower.run()
        except ZqError as exc:
            log.error("standby stopped: %s", exc)
            follower.state.error = str(exc)

    def journal_epoch(self, follower) -> int:  # type: ignore[no-untyped-def]
        """The newest epoch this node's journal has seen (a new epoch must pass it)."""
        if follower is not None:
            return int(follower.last_epoch)
        journal = LmdbJournal(self.config.data, durability="fsync")
        try:
            return replica.last_epoch(journal)
        finally:
            journal.close()

    def rejoin(self) -> None:
        log.warning("ZooKeeper session lost: joining again")
        deadline = time.monotonic() + 60
        while self.coord.lost and not self.stopping.is_set() and time.monotonic() < deadline:
            if self.coord.zk.connected:
                try:
                    self.coord.after_lost()
                    return
                except Exception as exc:  # noqa: BLE001 -- ZooKeeper still away: try again
                    log.warning("rejoin: %s", exc)
            self.stopping.wait(0.2)

    # ------------------------------------------------------------ leading

    def lead(self, state: ClusterState) -> None:
        from zq.server.loop import Server
        from zq.server.sessions import wall_ms

        self.terms += 1
        journal = LmdbJournal(self.config.data, durability="fsync")
        try:
            first = replica.begin_epoch(journal, state.epoch)
        finally:
            journal.close()
        log.warning("leading the cluster as epoch %d (node %s, records from bookmark %d on)", state.epoch,
                    self.cc.node, first)
        duty = LeaderDuty(self.coord, state, self.config, wall_ms())
        responder, self.responder = self.responder, None
        router, waiting = responder.hand_over() if responder is not None else (None, [])
        try:
            server = Server(self.config, context=self.ctx, cluster=duty, router=router)
        except ZqError:
            self.coord.release()
            raise
        server.adopt(waiting)  # what clients sent during the election: answered as if just arrived
        duty.stop_server = server.stop
        self.server, self.duty = server, duty

        def watch() -> None:
            while not server.stopping.wait(0.05):
                st = self.coord.state
                if st is not None and st.epoch > duty.epoch:
                    duty.deposed = True
                if self.coord.lost or duty.deposed:
                    log.warning("stepping down: %s", "ZooKeeper session lost" if self.coord.lost else "a newer epoch exists")
                    server.stop()
                    return

        watcher = threading.Thread(target=watch, name="zq-cluster-watch", daemon=True)
        watcher.start()
        if self.stopping.is_set():
            duty.hand_over()
        try:
            server.run()
        finally:
            self.server = self.duty = None
            self.coord.release()
            self.changed.set()
            watcher.join(2)
