"""A client's session in the dispatcher: who it is (``Peer``), how its subscriptions
are named in the engine (``sub_key``: ids are per session), and the checks on what
a client names. Used by the loop, the command handlers and the operator actions.

A session is named to the engine, the journal and every client (STATS, explain,
group holders) by an opaque ``label`` drawn at random when it opens, never by its
ROUTER routing id: a routing id is what a peer would need to take a session over
(a client may choose its own), so it stays inside the loop (docs/reliability.md).
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from zq.core import limits
from zq.core.errors import ProtocolError
from zq.server.security import Rights


@dataclass
class Peer:
    peer_id: bytes
    name: str
    last_heard_ms: int
    subs: set[str] = field(default_factory=set)  # client sub ids
    published: int = 0
    rights: Rights | None = None  # with security on: what this client's key may do
    replica_position: int = -1  # a standby: every record below this is synced on its disk (-1: not a standby)
    node: str = ""  # a cluster standby's node name
    notices: bool = False  # its HELLO accepts NOTICE frames (what its held confirmations wait for)
    prev_end: int = 0  # a cluster standby: the journal's end at its previous report (has it caught up?)
    key: str | None = None  # with security on: the client key (ZAP User-Id) the session was opened with
    bounds_waiting: int = 0  # its BOUNDS waiting for the journal to grow (a standby has one)
    label: str = field(default_factory=lambda: os.urandom(8).hex())  # the session's public name
    # What waits here for it to read (zq.server.outflow): bytes handed to libzmq, bytes
    # its host acknowledged (TCP_INFO, less acked_base), its connection's descriptor
    # (-1: not learnt yet; -2: not TCP) and address, and deliveries held while it reads.
    out_bytes: int = 0
    cleared: int = 0
    acked_base: int = 0
    fd: int = -1
    address: tuple = ()
    stalled_since: int = 0  # over the unread limit without reading since (ms; 0: not)
    window_cleared: int = 0  # ``cleared`` when that window began (it must read a quarter of the limit in it)
    unread_cap: int = 1 << 62  # its own limit, lowered to 0 while the dispatcher as a whole holds too much
    measured_out: int = -1  # out_bytes when it was last measured (a reckoning skips it if unchanged)
    ranges_waiting: int = 0  # its RANGE requests the reader thread has not answered yet
    paused: collections.deque | None = None  # deliveries and what follows them, waiting for it to read

    @property
    def consumer(self) -> str:
        """The engine's (and journal's, and STATS') name for this session: its label."""
        return self.label


class PeerTable(dict[bytes, Peer]):
    """Sessions by routing id, with an index by label (``by_label``): deliveries and
    revokes name a session by its label, and find its routing id here."""

    def __init__(self, peers: Iterable[tuple[bytes, Peer]] = ()) -> None:
        super().__init__()
        self.by_label: dict[str, Peer] = {}
        for k, v in peers:
            self[k] = v

    def __setitem__(self, peer_id: bytes, peer: Peer) -> None:
        old = self.get(peer_id)
        if old is not None and old is not peer:
            self.by_label.pop(old.label, None)
        super().__setitem__(peer_id, peer)
        self.by_label[peer.label] = peer

    def __delitem__(self, peer_id: bytes) -> None:
        peer = self[peer_id]
        super().__delitem__(peer_id)
        self.by_label.pop(peer.label, None)

    def pop(self, peer_id: bytes, *default):  # type: ignore[no-untyped-def,override]
        peer = super().pop(peer_id, *default)
        if isinstance(peer, Peer) and self.by_label.get(peer.label) is peer:
            del self.by_label[peer.label]
        return peer

    def clear(self) -> None:
        super().clear()
        self.by_label.clear()

    def popitem(self):  # type: ignore[no-untyped-def]
        peer_id, peer = super().popitem()
        self.by_label.pop(peer.label, None)
        return peer_id, peer

    def update(self, *args, **kw):  # type: ignore[no-untyped-def,override]
        for k, v in dict(*args, **kw).items():
            self[k] = v

    def setdefault(self, peer_id, default=None):  # type: ignore[no-untyped-def,override]
        if peer_id not in self:
            self[peer_id] = default
        return self[peer_id]


def sub_key(peer: Peer, sub: str) -> str:
    """The engine's name for a client's subscription: ids are scoped per connection."""
    return f"{peer.consumer}/{sub}"


def peer_of(peers: dict[bytes, Peer], consumer: str) -> Peer | None:
    """The live session an engine consumer id (a session label) names, if any."""
    by_label = getattr(peers, "by_label", None)
    if by_label is not None:
        return by_label.get(consumer)
    return next((p for p in peers.values() if p.label == consumer), None)


def holder_name(peers: dict[bytes, Peer], consumer: str | None) -> str | None:
    """The name a group's holder gave at HELLO (its consumer id if it gave none)."""
    if consumer is None:
        return None
    peer = peer_of(peers, consumer)
    return (peer.name or consumer) if peer is not None else consumer


def check_sub_id(sub: str) -> None:
    if not sub or len(sub) > limits.NAME_BYTES_MAX or len(sub.encode()) > limits.NAME_BYTES_MAX:
        raise ProtocolError(f"a subscription id must be 1..{limits.NAME_BYTES_MAX} bytes")


def is_local(endpoint: str) -> bool:
    """Does this endpoint accept connections from this host only?"""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = endpoint.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def wall_ms() -> int:
    return time.time_ns() // 1_000_000
