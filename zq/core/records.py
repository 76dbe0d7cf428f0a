"""Journal records: what the engine asks to be made durable, and what recovery reads.

One global sequence numbers every message and every event, so that everything
recorded about message ``m`` sits at a sequence above ``m``. Recovery of a queue
therefore only reads records at or above the queue's recovery point.

Events are batched: one record names every bookmark of one kind, for one queue and
one consumer, produced by one engine step. Analytics explode them into rows.

Schema evolution follows msgspec's rules: append fields with defaults, never reorder.
"""

from __future__ import annotations

import msgspec

JOURNAL_FORMAT_VERSION = 2  # 2: each stored record ends with its CRC-32 (zq.journal.integrity); 1 is read as it is

# Event kinds. ``leased`` is a delivery (for at-most-once queues it also removes
# the message); ``returned`` is a lease broken by disconnect or unsubscribe.
LEASED = "leased"
ACKED = "acked"
CANCELLED = "cancelled"
LEASE_EXPIRED = "lease-expired"
RETURNED = "returned"
EXPIRED = "expired"  # removed; ``reason`` says why, dead-lettered if the queue says so
# Waits until ``due_ms`` before it goes (again): a retry's backoff, or a publish's delay.
# Recovery honours the newest one not followed by a delivery.
DELAYED = "delayed"
RECLAIMED = "reclaimed"  # the holder gave back a delivery it had not started (asked by a revoke): not counted
EVENT_KINDS = (LEASED, ACKED, CANCELLED, LEASE_EXPIRED, RETURNED, EXPIRED, DELAYED, RECLAIMED)

# Delay reasons (the ``reason`` of a ``delayed`` event).
DELAY_BACKOFF = "backoff"  # the queue's retry schedule, after a cancel or a lease expiry
DELAY_REQUESTED = "requested"  # the cancel named its own delay
DELAY_PUBLISHED = "published"  # published with a delay / not-before time

# Expiry reasons (also the ``zq.reason`` header of a dead letter).
REASON_MAX_CANCELS = "max-cancels"
REASON_MAX_DELIVERIES = "max-deliveries"
REASON_EXPIRED = "expired"
REASON_REQUESTED = "expire-requested"
REASON_OVERFLOW = "overflow"
REASON_REPLACED = "replaced"
REASON_BARRIER = "barrier"  # a barrier message was delivered to every matching subscriber and left
REASON_MAX_FAILURES = "max-failures"  # cancelled with an error string this many times
REASON_MAX_LEASE_EXPIRIES = "max-lease-expiries"
REASON_MAX_CONSUMER_GONE = "max-consumer-gone"  # its holder's session ended (or the dispatcher died) this often
# Its content could not be evaluated by the queue (priority, sort key, last-value key): set
# aside on entry, live or at recovery, so that one message never stops a dispatcher. The
# ``expired`` event carries the error per bookmark (``errors``), the dead letter ``zq.error``.
REASON_POISON = "poison"
REASON_TTL = "ttl"  # still waiting at the deadline its publish gave it (zq.core.deadlines)
RETURN_RESTART = "dispatcher-restart"  # the reason of a ``returned`` event journaled by recovery: held when it died
NOT_DEAD_LETTERED = (REASON_REPLACED, REASON_BARRIER)  # a last-value queue kept a newer message of the same key (not dead-lettered)


class Message(msgspec.Struct, array_like=True, gc=False, tag="m"):
    """A published message. ``copy_of`` names the message whose payload and headers
    the journal copies in when it writes this record (dead letters): the engine
    never holds payloads."""

    seq: int
    ts_ms: int
    topic: str
    headers: dict[str, str]
    payload: bytes
    msg_id: str | None = None
    copy_of: int | None = None


class Event(msgspec.Struct, array_like=True, gc=False, tag="e"):
    seq: int
    ts_ms: int
    kind: str
    queue: str
    consumer: str
    bookmarks: list[int]
    deliveries: list[int]
    reason: str = ""
    consumer_name: str = ""  # the name the consumer gave at HELLO (appended: older records decode with "")
    due_ms: list[int] = []  # ``delayed``: when each bookmark may go (Unix ms); appended, [] elsewhere
    errors: list[str] = []  # ``expired`` for poison: why each bookmark could not be evaluated; appended, [] elsewhere


class QueueDeclared(msgspec.Struct, array_like=True, gc=False, tag="q"):
    """A queue created at run time (auto-created); config queues live in the config."""

    settings_json: bytes  # msgspec JSON of QueueSettings, so new fields stay readable
    ts_ms: int


class QueueDeleted(msgspec.Struct, array_like=True, gc=False, tag="x"):
    """A run-time queue was deleted: its declaration leaves the journal."""

    queue: str
    ts_ms: int


class RecoveryPoint(msgspec.Struct, array_like=True, gc=False, tag="r"):
    """Everything of ``queue`` below ``seq`` is finished (acked, expired or not its topic)."""

    queue: str
    seq: int
    ts_ms: int


def resolve_copy(rec: Message, original: Message | None) -> Message:
    """A dead letter carries its original's payload and headers plus zq.* headers."""
    if original is None:
        return Message(rec.seq, rec.ts_ms, rec.topic, {**rec.headers, "zq.missing": "original-trimmed"}, b"")
    if not rec.headers:  # a plain copy (redrive): the original as it was published
        headers = {k: v for k, v in original.headers.items() if not k.startswith("zq.")}
        return Message(rec.seq, rec.ts_ms, rec.topic, headers, original.payload, original.msg_id)
    kept = original.headers
    if "zq.expires_at" in kept:  # a copy (dead letter, move) has no deadline of its own (zq.core.deadlines)
        kept = {k: v for k, v in kept.items() if k != "zq.expires_at"}
    headers = {**kept, **rec.headers, "zq.topic": original.headers.get("zq.topic", original.topic)}
    return Message(rec.seq, rec.ts_ms, rec.topic, headers, original.payload, original.msg_id)


Record = Message | Event | QueueDeclared | RecoveryPoint | QueueDeleted

record_encoder = msgspec.msgpack.Encoder()
record_decoder = msgspec.msgpack.Decoder(Record)
message_decoder = msgspec.msgpack.Decoder(Message)
event_decoder = msgspec.msgpack.Decoder(Event)
