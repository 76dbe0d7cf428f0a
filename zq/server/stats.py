"""STATS: what the dispatcher reports about itself (``zq stats``, ``zq top``, metrics).

``Stats`` is a mixin of ``zq.server.loop.Server``: it reads the loop's counters and the
engine's; the attributes are declared here for the type checker.

What a client is shown: with security on, a key sees the queues it may consume or
browse, and the sessions (``peers``, standbys, the cluster's view) only with the admin
right ``stats``; otherwise only its own session. No one is shown a routing id: a
session is named by its label (``zq.server.sessions``). The operator's views (the
metrics endpoint, in-process sessions, a dispatcher without security) see everything.
"""

from __future__ import annotations

import collections
import itertools
from typing import TYPE_CHECKING, Any

from zq.core import limits
from zq.core.engine import Engine
from zq.journal.lmdb_journal import LmdbJournal
from zq.server.commands import SERVER_NAME
from zq.server.config import Config
from zq.server.held import HeldConfirmations
from zq.server.quotas import KeyQuotas
from zq.server.outflow import Outflow
from zq.server.security import Security
from zq.server.sessions import Peer, holder_name, peer_of

if TYPE_CHECKING:
    from zq.server.leadership import LeaderDuty

STATS_PEERS_MAX = 1_000  # sessions listed in one STATS answer (server.peers counts them all)
STATS_QUEUES_MAX = limits.STATS_QUEUES_MAX


class Stats:
    """The STATS answer (docs/protocol.md lists every field)."""

    config: Config
    engine: Engine
    journal: LmdbJournal
    peers: dict[bytes, Peer]
    security: Security | None
    samples: collections.deque[tuple[int, tuple[int, int, int]]]
    started_ms: int
    frames_in: int
    strangers_silenced: int
    frames_out: int
    loop_max_ms: float
    loop_max_phases: dict[str, float]
    slowest_command: tuple[float, str]
    slow_commands: int
    internal_errors: int
    bulk_actions: collections.deque[Any]
    journal_down: str | None
    journal_down_since: int
    journal_failures: int
    endpoints: list[str]
    confirmations: HeldConfirmations
    quotas: KeyQuotas
    outflow: Outflow
    paused_peers: set[bytes]
    cluster: LeaderDuty | None
    asking: Peer | None

    def totals(self) -> tuple[int, int, int]:
        qs = self.engine.queues.values()
        return (self.engine.published, sum(q.delivered for q in qs), sum(q.acked for q in qs))

    def rates(self, now: int) -> dict[str, float]:
        """Per-second publish / deliver / ack rates over the last few seconds."""
        if not self.samples:
            return {"publish": 0.0, "deliver": 0.0, "ack": 0.0}
        then, old = self.samples[0]
        cur = self.totals()
        dt = max(now - then, 1) / 1000
        return {k: round((c - o) / dt, 1) for k, c, o in zip(("publish", "deliver", "ack"), cur, old)}

    def stats(self, now: int, names: list[str] | None = None, limit: int = STATS_QUEUES_MAX) -> dict:
        """``names``: only those queues; ``limit``: at most that many (0: every one, the
        metrics endpoint's view)."""
        viewer = self.asking if self.security is not None else None
        rights = viewer.rights if viewer is not None else None
        everyone = rights is None or rights.allows("admin", "stats")
        st = self.engine.stats(names, limit, rights.sees if rights is not None else None)
        for q in st["queues"].values():
            for b in q.get("group_summary", {}).get("busiest", ()):
                b["holder"] = holder_name(self.peers, b["owner"])
            for c in q["consumers"]:
                peer = peer_of(self.peers, c["consumer"])
                c["name"] = peer.name if peer is not None else ""
                c["heard_ms_ago"] = now - peer.last_heard_ms if peer is not None else None
        shown = self.peers.values() if everyone else [viewer] if viewer is not None else []
        # At most STATS_PEERS_MAX sessions listed (the count is always whole): ten thousand
        # sessions once made every STATS answer megabytes and held the loop for seconds.
        st["peers"] = [
            {"consumer": p.consumer, "name": p.name, "heard_ms_ago": now - p.last_heard_ms,
             "subscriptions": len(p.subs), "published": p.published, "sent_bytes": p.out_bytes}
            for p in itertools.islice(shown, STATS_PEERS_MAX)
        ]
        st["server"] = {
            "version": SERVER_NAME,
            "uptime_ms": now - self.started_ms,
            "durability": self.config.durability,
            "journal_bytes": self.journal.size_bytes(),
            "journal_map_bytes": self.journal.env.info()["map_size"],
            "publishers": sum(1 for p in self.peers.values() if p.published and not p.subs),
            "workers": sum(1 for p in self.peers.values() if p.subs),
            "peers": len(self.peers),
            "peers_listed": len(st["peers"]),  # (at most STATS_PEERS_MAX)
            "queues": st.pop("queues_total"),  # (``queues`` lists at most STATS_QUEUES_MAX of them)
            "queues_listed": len(st["queues"]),
            "frames_in": self.frames_in,
            "frames_out": self.frames_out,
            "loop_max_ms": round(self.loop_max_ms, 3),
            "loop_max_phases": self.loop_max_phases,
            "slowest_command": {"ms": round(self.slowest_command[0], 3), "command": self.slowest_command[1]},
            "slow_commands": self.slow_commands,
            "dispatch_deferred": self.engine.dispatch_deferred,  # dispatches left for the next step at the filter budget
            "internal_errors": self.internal_errors,
            "bulk_actions": len(self.bulk_actions),
            "unread": {**self.outflow.stats(), "paused_peers": len(self.paused_peers),  # zq.server.outflow
                       "strangers_silenced": self.strangers_silenced},
            "security": ({**self.security.stats(), "quotas": self.quotas.stats()} if self.security is not None
                         else {"on": False}),
            "journal": {"writable": self.journal_down is None, "cause": self.journal_down,
                        "down_ms": now - self.journal_down_since if self.journal_down else 0,
                        "failures": self.journal_failures, **self.journal.sync_stats()},
            "endpoints": self.endpoints,
            "rates": self.rates(now),
            "replication": {
                "replicas_ack": self.config.replicas_ack, "held_confirmations": len(self.confirmations.replicated),
                "flow_held_confirmations": self.confirmations.flow_count,
                "standbys": [{"name": p.name, "node": p.node, "position": p.replica_position,
                              "lag_records": max(0, self.engine.next_seq - p.replica_position),
                              "lag_ms": self.cluster.lag_of(p.node, now) if self.cluster is not None and p.node else None,
                              "in_sync": p.node in self.cluster.isr if self.cluster is not None else None,
                              "heard_ms_ago": now - p.last_heard_ms}
                             for p in shown if p.replica_position >= 0],
                "cluster": self.cluster.stats(self.peers, now) if self.cluster is not None and everyone else None,
            },
        }
        return st
