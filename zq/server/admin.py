"""Operator commands over the wire (ADMIN frames): one function per operation.

Each operation's arguments are a msgspec Struct, so a malformed request gets an
error naming the field; the work itself is the engine's (``zq.core.manage``). A bulk
action (purge, move, ack-filter, redrive) answers with a ``Bulk``: the server runs it a
slice per loop iteration and answers its total when the last slice is done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import msgspec

from zq.core.engine import Engine
from zq.core.errors import ProtocolError
from zq.core.manage import BulkCursor
from zq.server.config import QueueSection, queue_settings
from zq.server.sessions import Peer, holder_name, sub_key


class AdminHost(Protocol):
    """What an operation needs of the dispatcher (the loop passes itself)."""

    engine: Engine
    peers: dict[bytes, Peer]

    def configured_queue(self, name: str) -> bool: ...


class Bulk(NamedTuple):
    """A bulk action to run slice by slice: ``step(cursor, now)`` does one, returns its count."""

    name: str
    step: Callable[[BulkCursor, int], int]


class Args(msgspec.Struct, forbid_unknown_fields=True):
    pass


class ReplaceArgs(Args):
    sub: str
    queue: str
    max_backlog: int = 1
    filter: str | None = None


class QueueArgs(Args):
    queue: str
    filter: str | None = None
    group: str | None = None


class AckFilterArgs(Args):
    queue: str
    filter: str


class MoveArgs(Args):
    queue: str
    to: str
    filter: str | None = None
    group: str | None = None


class GroupsArgs(Args):
    queue: str
    limit: int = 1000


class QueueDeleteArgs(Args):
    name: str


def replace(server: AdminHost, peer: Peer, a: ReplaceArgs, now: int) -> Any:
    if a.sub not in peer.subs:
        raise ProtocolError(f"no subscription {a.sub!r} on this connection")
    return server.engine.replace(sub_key(peer, a.sub), a.queue, a.max_backlog, a.filter, now)


def ack_filter(server: AdminHost, peer: Peer, a: AckFilterArgs, now: int) -> Any:
    consumer = peer.consumer
    return Bulk("ack-filter", lambda c, now: server.engine.ack_filter(a.queue, a.filter, consumer, now, cursor=c))


def purge(server: AdminHost, peer: Peer, a: QueueArgs, now: int) -> Any:
    return Bulk("purge", lambda c, now: server.engine.purge(a.queue, now, filter=a.filter, group=a.group, cursor=c))


def move(server: AdminHost, peer: Peer, a: MoveArgs, now: int) -> Any:
    return Bulk("move", lambda c, now: server.engine.move(a.queue, a.to, now, filter=a.filter, group=a.group,
                                                         cursor=c))


def redrive(server: AdminHost, peer: Peer, a: QueueArgs, now: int) -> Any:
    if a.group is not None:
        raise ProtocolError("redrive takes a filter, not a group")
    return Bulk("redrive", lambda c, now: server.engine.redrive(a.queue, now, filter=a.filter, cursor=c))


def groups(server: AdminHost, peer: Peer, a: GroupsArgs, now: int) -> Any:
    rows = server.engine.group_list(a.queue, a.limit)
    for row in rows:  # Qpid's queue query: each group's holder, by the name it gave at HELLO
        row["holder"] = holder_name(server.peers, row["owner"])
    return rows


def queue_create(server: AdminHost, peer: Peer, a: QueueSection, now: int) -> Any:
    settings = queue_settings(a, f"queue {a.name!r}")
    server.engine.declare_queue(settings, server.configured_queue)
    return msgspec.to_builtins(server.engine.queues[a.name].settings)


def queue_delete(server: AdminHost, peer: Peer, a: QueueDeleteArgs, now: int) -> Any:
    return server.engine.delete_queue(a.name, server.configured_queue, now)


OPERATIONS: dict[str, tuple[type, Callable[..., Any]]] = {
    "replace": (ReplaceArgs, replace),
    "ack-filter": (AckFilterArgs, ack_filter),
    "purge": (QueueArgs, purge),
    "move": (MoveArgs, move),
    "redrive": (QueueArgs, redrive),
    "groups": (GroupsArgs, groups),
    "queue-create": (QueueSection, queue_create),
    "queue-delete": (QueueDeleteArgs, queue_delete),
}


def run(server: AdminHost, peer: Peer, op: str, args: dict, now: int) -> Any:
    spec = OPERATIONS.get(op)
    if spec is None:
        raise ProtocolError(f"unknown admin operation {op!r} (known: {', '.join(sorted(OPERATIONS))})")
    kind, fn = spec
    try:
        parsed: Any = msgspec.convert(args, type=kind)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"{op}: {exc}") from None
    return fn(server, peer, parsed, now)
