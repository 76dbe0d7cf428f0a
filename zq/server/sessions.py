"""A client's session in the dispatcher: who it is (``Peer``), how its subscriptions
are named in the engine (``sub_key``: ids are per connection), and the checks on what
a client names. Used by the loop, the command handlers and the operator actions."""

from __future__ import annotations

import time
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
    prev_end: int = 0  # a cluster standby: the journal's end at its previous report (has it caught up?)

    @property
    def consumer(self) -> str:
        return self.peer_id.hex()


def sub_key(peer: Peer, sub: str) -> str:
    """The engine's name for a client's subscription: ids are scoped per connection."""
    return f"{peer.consumer}/{sub}"


def holder_name(peers: dict[bytes, Peer], consumer: str | None) -> str | None:
    """The name a group's holder gave at HELLO (its consumer id if it gave none)."""
    if consumer is None:
        return None
    try:
        peer = peers.get(bytes.fromhex(consumer))
    except ValueError:
        return consumer
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
