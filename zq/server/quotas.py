"""What one client key may hold of what every key shares (with ``[security]``).

The dispatcher's own caps (``server.max_connections``, 100,000 subscriptions, 10,000
queues) are shared by everyone: one key could fill them within its rights and leave
nobody else a session, a subscription or a new topic. Each key gets a share of its
own, set per key beside its entitlements (``max_sessions``, ``max_subscriptions``,
``max_queues``; defaults in ``zq.core.limits``). Without ``[security]`` there are no
keys to tell peers apart: every peer is trusted alike, and only the per-connection
and dispatcher-wide caps apply (docs/reliability.md, the trust model).

The in-process links of an embedded dispatcher (its host's own clients) carry no
key and are not counted.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from zq.core.errors import LimitError
from zq.server.security import Rights
from zq.server.sessions import Peer


class KeyQuotas:
    def __init__(self) -> None:
        self.sessions: dict[str, set[bytes]] = {}  # key -> its sessions' routing ids
        self.queues_created: collections.Counter[str] = collections.Counter()  # key -> queues its frames created
        self.refused = 0  # requests refused by a quota, all keys

    def check_session(self, key: str, rights: Rights) -> None:
        if len(self.sessions.get(key, ())) >= rights.max_sessions:
            self.refused += 1
            raise LimitError(f"this client's key has {rights.max_sessions:,} sessions open, its max_sessions: "
                             "close one first")

    def opened(self, key: str, peer_id: bytes) -> None:
        self.sessions.setdefault(key, set()).add(peer_id)

    def closed(self, key: str, peer_id: bytes) -> None:
        mine = self.sessions.get(key)
        if mine is not None:
            mine.discard(peer_id)
            if not mine:
                del self.sessions[key]

    def check_subscription(self, peer: Peer, peers: Mapping[bytes, Peer]) -> None:
        """Before a new subscription or claim of a keyed session."""
        if peer.key is None or peer.rights is None:
            return
        held = 0
        for pid in self.sessions.get(peer.key, ()):
            other = peers.get(pid)
            if other is not None:
                held += len(other.subs)
        if held >= peer.rights.max_subscriptions:
            self.refused += 1
            raise LimitError(f"this client's key holds {held:,} subscriptions and claims, its max_subscriptions: "
                             "end some first")

    def check_new_queue(self, peer: Peer, count: int = 1) -> None:
        """Before a frame that would create ``count`` queues (a publish to a topic no queue
        takes, queue-create, a move to a new topic, a transaction's outputs)."""
        if peer.key is None or peer.rights is None:
            return
        if self.queues_created[peer.key] + count > peer.rights.max_queues:
            self.refused += 1
            raise LimitError(f"this client's key has created {peer.rights.max_queues:,} queues, its max_queues: "
                             "publish to a topic a queue already takes, or ask an operator")

    def created(self, peer: Peer, n: int) -> None:
        if peer.key is not None and n > 0:
            self.queues_created[peer.key] += n

    def stats(self) -> dict:
        return {"keys_with_sessions": len(self.sessions), "refused": self.refused}
