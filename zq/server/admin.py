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

from zq.core import limits
from zq.core import records as R
from zq.core.engine import Engine
from zq.core.errors import NotEntitledError, ProtocolError
from zq.core.explain import explain as explain_message
from zq.core.manage import ALTERABLE, FIXED_WHY, BulkCursor
from zq.journal import replica
from zq.journal.lmdb_journal import LmdbJournal
from zq.server.config import CONVERTED_KEYS, QueueSection, queue_settings, setting_changes
from zq.server.security import Rights
from zq.server.sessions import Peer, holder_name, sub_key
from zq.server.snapshots import Snapshots


class AdminHost(Protocol):
    """What an operation needs of the dispatcher (the loop passes itself)."""

    engine: Engine
    peers: dict[bytes, Peer]
    journal: LmdbJournal

    def configured_queue(self, name: str) -> bool: ...

    @property
    def epoch(self) -> int: ...

    snapshots: Snapshots


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


class ExplainArgs(Args):
    queue: str
    bookmark: int | None = None
    msg_id: str | None = None
    topic: str | None = None  # where to look the msg_id up (default: the queue's name)
    history: int = 100  # delivery events to return, newest last


EXPLAIN_EVENTS_SCAN = 100_000  # journal events read after the message, at most (the loop's budget: ~0.1 s)
EXPLAIN_HISTORY_MAX = 1_000


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


# A topics pattern a narrow key may give: a literal (``\\.`` for a dot) or a literal
# followed by one trailing ``.*`` / ``.+``; any other regex needs consume ["*"].
_REGEX_META = set("^$.*+?()[]{}|\\")


def _literal_prefix(pattern: str) -> tuple[str, bool] | None:
    """``pattern`` as (literal, open-ended) if it is a literal, or a literal then a
    trailing ``.*`` / ``.+``; None for anything else (any other metacharacter)."""
    open_ended = pattern.endswith((".*", ".+")) and not pattern.endswith(("\\.*", "\\.+"))
    body = pattern[:-2] if open_ended else pattern
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            if i + 1 >= len(body) or body[i + 1].isalnum():  # \d, \w, \A, ...: a class, not a literal
                return None
            out.append(body[i + 1])
            i += 2
            continue
        if ch in _REGEX_META:
            return None
        out.append(ch)
        i += 1
    return "".join(out), open_ended


def _glob_covers_prefix(globs: list[str], prefix: str) -> bool:
    """Is every name starting with ``prefix`` matched by one of ``globs``? (A glob
    ``X*`` with no other wildcard, and ``prefix`` starting with ``X``.)"""
    for g in globs:
        if g == "*":
            return True
        head = g[:-1]
        if g.endswith("*") and not any(c in head for c in "*?[") and prefix.startswith(head):
            return True
    return False


def check_queue_rights(rights: Rights, a: QueueSection) -> None:
    """A narrow key may create a queue only over what it may read and write itself:
    the name (the topic it reads when ``topics`` is unset) within its ``consume`` globs,
    ``topics`` a literal within them or a literal prefix then ``.*`` that one glob
    covers (any other regex needs consume ["*"]), and ``publish_to`` / ``dead_letter``
    (where the queue writes) within its ``publish`` globs."""
    def refuse(what: str) -> NotEntitledError:
        return NotEntitledError(f"queue-create: this client's key may not {what}")

    if not rights.allows("consume", a.name):
        raise refuse(f"consume {a.name[:80]!r}, so it may not create it")
    if a.topics is not None and not rights.everything("consume"):
        literal = _literal_prefix(a.topics)
        if literal is None:
            raise refuse(f"read topics {a.topics[:80]!r}: a narrow key's topics are a literal, or a literal "
                         "then .*, within its consume entitlements")
        text, open_ended = literal
        if not (_glob_covers_prefix(rights.consume, text) if open_ended else rights.allows("consume", text)):
            raise refuse(f"read topics {a.topics[:80]!r}")
    for field_name in ("publish_to", "dead_letter"):
        target = getattr(a, field_name)
        if target is not None and not rights.allows("publish", target):
            raise refuse(f"publish to {target[:80]!r} ({field_name})")


def queue_create(server: AdminHost, peer: Peer, a: QueueSection, now: int) -> Any:
    if peer.rights is not None:  # with security on, a remote key: its settings are checked against its rights
        check_queue_rights(peer.rights, a)
    settings = queue_settings(a, f"queue {a.name!r}")
    server.engine.declare_queue(settings, server.configured_queue)
    return msgspec.to_builtins(server.engine.queues[a.name].settings)


# A config key's setting (zq.toml's ``lease`` is the settings' ``lease_ms``).
_SETTING_OF = {**CONVERTED_KEYS, "backoff": "backoff_ms"}


def queue_alter(server: AdminHost, peer: Peer, a: dict, now: int) -> Any:
    """``name`` and the config keys to change, as in zq.toml (``lease = "5s"``; null puts
    a key back to its default). Read by hand, not by a Struct, so that a key which
    cannot change is refused saying why rather than as an unknown field."""
    args = dict(a)
    name = args.pop("name", None)
    if type(name) is not str:
        raise ProtocolError("queue-alter: name: a queue's name is a string")
    if peer.rights is not None and not peer.rights.allows("consume", name):
        raise NotEntitledError(f"queue-alter: this client's key may not consume {name[:80]!r}")
    if not args:
        raise ProtocolError("queue-alter: name at least one setting to change")
    unknown = sorted(k for k in args if k not in QueueSection.__struct_fields__ or k == "name")
    if unknown:
        raise ProtocolError(f"queue-alter: no queue setting {unknown[0][:80]!r}")
    fields = {key: _SETTING_OF.get(key, key) for key in args}
    fixed = sorted(key for key, field in fields.items() if field not in ALTERABLE)
    if fixed:
        raise ProtocolError(f"queue {name[:80]!r}: {', '.join(fixed)} cannot change on a live queue: {FIXED_WHY}")
    target = args.get("dead_letter")
    if peer.rights is not None and target is not None and not peer.rights.allows("publish", target):
        raise NotEntitledError(f"queue-alter: this client's key may not publish to {str(target)[:80]!r} (dead_letter)")
    current = server.engine.queue(name).settings  # (an unknown queue: unknown-queue, before the values)
    changes = setting_changes(args, current, f"queue {name[:80]!r}")
    changed = server.engine.alter_queue(name, changes, server.configured_queue)
    return {"changed": changed, "settings": msgspec.to_builtins(server.engine.queues[name].settings)}


def queue_delete(server: AdminHost, peer: Peer, a: QueueDeleteArgs, now: int) -> Any:
    return server.engine.delete_queue(a.name, server.configured_queue, now)


def explain(server: AdminHost, peer: Peer, a: ExplainArgs, now: int) -> Any:
    """Why a message is where it is, and its delivery history from the journal."""
    server.engine.queue(a.queue)  # an unknown queue is an error before anything is read
    seq = a.bookmark
    if (seq is None) == (a.msg_id is None):
        raise ProtocolError("explain takes a bookmark or a msg_id")
    if a.msg_id is not None:
        topic = a.topic or a.queue
        if len(a.msg_id.encode()) > limits.HEADER_BYTES_MAX or len(topic.encode()) > limits.TOPIC_BYTES_MAX:
            raise ProtocolError(f"a msg_id is at most {limits.HEADER_BYTES_MAX} bytes, a topic {limits.TOPIC_BYTES_MAX}")
        found = server.journal.find_id(topic, a.msg_id)
        if found is None:
            raise ProtocolError(f"no message with msg_id {a.msg_id!r} on topic {topic!r} in the journal "
                                "(ids are kept for the dedup window; name the topic with topic=)")
        seq = found[0]
    assert seq is not None
    if not 0 <= seq < 1 << 64:
        raise ProtocolError("a bookmark is 0..2**64-1")
    msg = server.journal.get_message(seq) if seq else None
    out = explain_message(server.engine, a.queue, seq, now, msg.topic if msg else None, msg.headers if msg else None)
    if msg is not None:
        out["topic"], out["published_ms_ago"], out["msg_id"] = msg.topic, max(0, now - msg.ts_ms), msg.msg_id
    out["history"], out["history_complete"] = history(server.journal, a.queue, seq, min(max(a.history, 0),
                                                                                       EXPLAIN_HISTORY_MAX))
    poison = next((ev for ev in out["history"] if ev["kind"] == R.EXPIRED and ev["reason"] == R.REASON_POISON), None)
    if poison is not None and out["state"] == "not-in-queue":
        target = server.engine.queue(a.queue).settings.dead_letter
        out["state"] = "poisoned"
        out["why"] = [f"set aside as poison: the queue could not evaluate its content ({poison.get('error', '?')}); "
                      + (f"dead-lettered to {target!r} with zq.reason = poison" if target else
                         "the queue has no dead_letter, so it was dropped")]
    return out


def history(journal: LmdbJournal, queue: str, seq: int, keep: int) -> tuple[list[dict], bool]:
    """The events of ``queue`` that name ``seq`` (the last ``keep``), read from the
    journal after it; complete unless the scan stopped at its budget first."""
    found: list[dict] = []
    for i, ev in enumerate(journal.read_events(seq)):
        if i >= EXPLAIN_EVENTS_SCAN:
            return found[-keep:] if keep else [], False
        if ev.queue != queue or seq not in ev.bookmarks:
            continue
        i = ev.bookmarks.index(seq)
        n = ev.deliveries[i] if len(ev.deliveries) == len(ev.bookmarks) else 0
        item = {"bookmark": ev.seq, "ts_ms": ev.ts_ms, "kind": ev.kind, "consumer": ev.consumer,
                "name": ev.consumer_name, "deliveries": n, "reason": ev.reason}
        if len(ev.due_ms) == len(ev.bookmarks):  # a ``delayed`` event: until when
            item["due_ms"] = ev.due_ms[i]
        if len(ev.errors) == len(ev.bookmarks):  # poison: why its content could not be evaluated
            item["error"] = ev.errors[i]
        found.append(item)
    return found[-keep:] if keep else [], True


class TablesArgs(Args):
    pass


def journal_tables(server: AdminHost, peer: Peer, a: TablesArgs, now: int) -> dict:
    """What a standby mirrors besides the records (``zq.server.standby``): the run-time
    queue declarations as stored, the recovery points, and the first bookmark the
    journal still holds (below it, retention deleted everything). Committed state only."""
    j = server.journal
    declared = j.declared_raw()  # as the wire carries them (the standby seals them again)
    with j.env.begin() as txn:
        first = 0
        for db in (j.msgs, j.events):
            with txn.cursor(db=db) as cur:
                if cur.first():
                    seq = int.from_bytes(cur.key(), "big")
                    first = seq if not first else min(first, seq)
    return {"declared": declared, "recovery_points": j.recovery_points(), "first_seq": first,
            "epochs": replica.epochs(j)}


class EpochEndArgs(Args):
    epoch: int = 0


def epoch_end(server: AdminHost, peer: Peer, a: EpochEndArgs, now: int) -> dict:
    """Where epoch ``a.epoch``'s records end in this leader's journal (Kafka's
    OffsetsForLeaderEpoch): a node that comes back truncates its own past it."""
    if not 0 <= a.epoch < 1 << 63:
        raise ProtocolError("an epoch is 0..2^63-1")
    return {"end": replica.end_of_epoch(replica.epochs(server.journal), a.epoch, server.engine.next_seq),
            "epoch": server.epoch}


class SnapshotArgs(Args):
    id: int = 0
    offset: int = 0
    size: int = 0


def snapshot_begin(server: AdminHost, peer: Peer, a: SnapshotArgs, now: int) -> dict:
    """A standby too far behind for records: start a copy of the whole journal
    (``zq.server.snapshots``); poll ``snapshot-status``, then ``snapshot-read`` it."""
    snap = server.snapshots.begin(peer.peer_id, now)
    return {"id": snap.id, "next_seq": snap.next_seq}


def snapshot_status(server: AdminHost, peer: Peer, a: SnapshotArgs, now: int) -> dict:
    snap = server.snapshots.get(a.id, peer.peer_id)
    return {"ready": snap.ready, "size": snap.size, "error": snap.error}


def snapshot_read(server: AdminHost, peer: Peer, a: SnapshotArgs, now: int) -> bytes:
    return server.snapshots.read(a.id, peer.peer_id, a.offset, a.size)


OPERATIONS: dict[str, tuple[type, Callable[..., Any]]] = {
    "replace": (ReplaceArgs, replace),
    "ack-filter": (AckFilterArgs, ack_filter),
    "purge": (QueueArgs, purge),
    "move": (MoveArgs, move),
    "redrive": (QueueArgs, redrive),
    "groups": (GroupsArgs, groups),
    "queue-create": (QueueSection, queue_create),
    "queue-alter": (dict, queue_alter),
    "queue-delete": (QueueDeleteArgs, queue_delete),
    "explain": (ExplainArgs, explain),
    "journal-tables": (TablesArgs, journal_tables),
    "epoch-end": (EpochEndArgs, epoch_end),
    "snapshot-begin": (SnapshotArgs, snapshot_begin),
    "snapshot-status": (SnapshotArgs, snapshot_status),
    "snapshot-read": (SnapshotArgs, snapshot_read),
}


# What an operation touches, as the rights a key needs besides the operation's name in
# its ``admin`` globs: (kind, argument field). Reading or changing a queue's messages
# needs what reading or consuming them would need; writing into a queue, what
# publishing there would.
QUEUE_RIGHTS: dict[str, tuple[tuple[str, str], ...]] = {
    "replace": (("consume", "queue"),),
    "ack-filter": (("consume", "queue"),),
    "purge": (("consume", "queue"),),
    "move": (("consume", "queue"), ("publish", "to")),
    "redrive": (("consume", "queue"),),
    "groups": (("browse", "queue"),),
    "queue-delete": (("consume", "name"),),
    "explain": (("browse", "queue"),),
}


def check_op_rights(rights: Rights, op: str, a: Any) -> None:
    """With security on: may this key do ``op`` to what it names? An admin right is
    the right to run the operation, not to reach every tenant's queues with it."""
    for kind, field_name in QUEUE_RIGHTS.get(op, ()):
        name = getattr(a, field_name)
        if not rights.allows(kind, name):
            raise NotEntitledError(f"{op}: this client's key may not {kind} {name[:80]!r}")
    if op == "explain" and a.topic is not None and not rights.allows("browse", a.topic):
        raise NotEntitledError(f"explain: this client's key may not browse {a.topic[:80]!r}")
    if op == "redrive" and not rights.everything("publish"):
        # (each dead letter goes back to the topic it came from, which only the journal knows)
        raise NotEntitledError("redrive: publishes each dead letter to its original topic, so it needs "
                               "publish [\"*\"]; this client's key has narrower publish entitlements")


def run(server: AdminHost, peer: Peer, op: str, args: dict, now: int) -> Any:
    spec = OPERATIONS.get(op)
    if spec is None:
        raise ProtocolError(f"unknown admin operation {op!r} (known: {', '.join(sorted(OPERATIONS))})")
    kind, fn = spec
    try:
        parsed: Any = msgspec.convert(args, type=kind)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"{op}: {exc}") from None
    if peer.rights is not None:  # with security on, a remote key
        check_op_rights(peer.rights, op, parsed)
    return fn(server, peer, parsed, now)
