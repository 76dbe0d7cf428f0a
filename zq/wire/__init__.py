"""ZQP/1: the frames between zq clients (DEALER) and the dispatcher (ROUTER).

Every message is exactly one frame from a DEALER (the ROUTER sees ``[peer_id][body]``):
a msgpack array whose first element is the command tag. Batches travel *inside* the
body (ANCHORS rule 2): one ``Publish`` carries many messages, one ``Deliver`` many
deliveries, one ``Ack`` many bookmarks. ``docs/protocol.md`` is the specification;
this module is its single source of truth in code.

Schema evolution (msgspec rules): append fields with defaults, never reorder.
"""

from __future__ import annotations

from typing import Any

import msgspec

from zq.core.records import Message

PROTOCOL_VERSION = 1
DEFAULT_ENDPOINT = "tcp://127.0.0.1:7780"  # where a dispatcher binds and clients connect, unless told


class _Cmd(msgspec.Struct, array_like=True, gc=False, tag_field="t"):
    pass


# ------------------------------------------------------------ client -> server


class Hello(_Cmd, tag="hello"):
    version: int
    name: str = ""  # human label, e.g. "host:pid worker-3"
    # Optional server frames this client understands (``NOTICE``): the dispatcher sends
    # none of them to a session that did not name it, so an older client never sees one.
    accepts: list[str] = []


class Publish(_Cmd, tag="pub"):
    """``messages``: [payload, headers, msg_id] each. Confirmed after commit."""

    req: int
    topic: str
    messages: list[tuple[bytes, dict[str, str], str | None]]
    delay_ms: int = 0  # no message of the frame goes before this long after the dispatcher commits it
    not_before_ms: int = 0  # ... nor before this Unix time (ms; the dispatcher's clock)
    ttl_ms: int = 0  # a message of the frame still waiting this long after the dispatcher took it expires (reason ttl)
    expires_at_ms: int = 0  # ... or at this Unix time (ms; the dispatcher's clock), whichever is sooner


class Subscribe(_Cmd, tag="sub"):
    req: int
    sub: str  # client-chosen id, unique per connection
    queue: str
    max_backlog: int = 1
    filter: str | None = None
    reclaimable: bool = False  # deliveries not yet started may be asked back (REVOKE) for an idle consumer


class Unsubscribe(_Cmd, tag="unsub"):
    req: int
    sub: str


class Ack(_Cmd, tag="ack"):
    sub: str
    bookmarks: list[int]
    epochs: list[int] = []  # fencing: the delivery count each bookmark was delivered with; [] = unfenced
    req: int = 0  # non-zero: answer with a REPLY giving every bookmark's result


class Cancel(_Cmd, tag="cancel"):
    sub: str
    bookmarks: list[int]
    epochs: list[int] = []  # fencing: the delivery count each bookmark was delivered with; [] = unfenced
    req: int = 0  # non-zero: answer with a REPLY giving every bookmark's result
    delay_ms: int = -1  # the messages go again after this long (0: at once); -1: the queue's backoff
    error: str = ""  # why the work failed: the deliveries count as failed (max_failures), kept as the last error


class Expire(_Cmd, tag="expire"):
    sub: str
    bookmarks: list[int]
    epochs: list[int] = []  # fencing: the delivery count each bookmark was delivered with; [] = unfenced
    req: int = 0  # non-zero: answer with a REPLY giving every bookmark's result


class Extend(_Cmd, tag="extend"):
    sub: str
    bookmarks: list[int]
    ms: int
    epochs: list[int] = []
    req: int = 0


class Transact(_Cmd, tag="tx"):
    """Settle and publish in one commit (``zq.core.transactions``): ack (or cancel)
    ``bookmarks``, delivered to ``sub`` with ``epochs`` (required: a transaction is
    fenced), and publish ``outputs`` ([topic, [[payload, headers, msg_id]]] each; an
    output without msg_id gets one derived from the input), all or nothing. Answered by
    one REPLY after the commit."""

    req: int
    sub: str
    op: str  # "ack" or "cancel"
    bookmarks: list[int]
    epochs: list[int]
    outputs: list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]] = []
    delay_ms: int = -1  # a cancel's: as CANCEL's
    error: str = ""  # a cancel's: as CANCEL's


class TransactMany(_Cmd, tag="txs"):
    """Several independent transactions of one subscription in one frame (what a worker
    sends without waiting, together): each ``[op, bookmarks, epochs, outputs, delay_ms,
    error]`` as TX's fields, all or nothing on its own. One REPLY ``{results: [...]}``
    gives each one's answer in order (TX's, or ``{error, message}``)."""

    req: int
    sub: str
    txs: list[tuple[str, list[int], list[int], list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]], int, str]]


class Release(_Cmd, tag="release"):
    """The answer to a REVOKE: ``bookmarks`` (delivered with ``epochs``) were not started
    and go back to the queue, no delivery counted; ``kept`` (with ``kept_epochs``) were
    started, or are not known to this client."""

    sub: str
    bookmarks: list[int]
    epochs: list[int] = []
    kept: list[int] = []
    kept_epochs: list[int] = []


class Heartbeat(_Cmd, tag="hb"):
    pass


class Bye(_Cmd, tag="bye"):
    pass


class Stats(_Cmd, tag="stats"):
    req: int
    queues: list[str] | None = None  # only these queues (None: the busiest, up to the server's cap)


class Peek(_Cmd, tag="peek"):
    req: int
    queue: str
    limit: int = 100
    filter: str | None = None


class Queues(_Cmd, tag="queues"):
    req: int


class Claim(_Cmd, tag="claim"):
    req: int
    sub: str  # the claim's subscription id on this connection (created by the first claim)
    queue: str
    limit: int = 1
    wait_ms: int = 0  # long poll: wait this long for at least one message
    lease_ms: int = 30_000
    destructive: bool = False
    filter: str | None = None


class Replay(_Cmd, tag="replay"):
    req: int
    sub: str  # the replay's id on this connection (its DELIVER frames carry it)
    target: str  # a topic, a queue's name (its topics), or a ^regex over topics
    start: int = 0  # first bookmark; -1: now (only what is published from here on)
    start_ms: int | None = None  # instead of start: the first message at or after this time
    end: int | None = None  # stop before this bookmark
    follow: bool = False  # keep delivering new messages once the history is read
    filter: str | None = None
    window: int = 1000  # delivered messages the client has not yet taken (ACK returns them)


class Admin(_Cmd, tag="admin"):
    """An operator action (``zq.server.admin.OPERATIONS``): replace, ack-filter, purge, move,
    redrive, groups, queue-create, queue-delete."""

    req: int
    op: str
    args: dict[str, Any] = {}


class Range(_Cmd, tag="range"):
    """Stored records for analytics, answered by the reader thread (``zq.server.ranges``)."""

    req: int
    kind: str = "messages"  # or "events"
    start: int = 0  # first bookmark
    end: int | None = None  # stop before this bookmark
    target: str | None = None  # messages: a topic, a queue (its topics), a ^regex; events: a queue
    limit: int = 65_536


class Bounds(_Cmd, tag="bounds"):
    """REPLY {next_seq, seq_at}: every record below ``next_seq`` is committed (the
    journal's end now); ``seq_at`` is the first message at or after ``at_ms``.
    A standby also says where its synced copy is (``position``: every record below it is
    on its disk) and may wait up to ``wait_ms`` for the journal to pass ``after``."""

    req: int
    at_ms: int | None = None
    after: int = -1
    wait_ms: int = 0
    position: int = -1
    node: str = ""  # a cluster standby's node name (zq.server.cluster)
    epoch: int = 0  # the newest leader epoch the standby knows: an older leader is refused
    # Who says so: a cluster node's token as ZooKeeper holds it for ``node``, or a hand-started
    # standby's ``[cluster] standby_secret``; a position without it counts for nothing.
    proof: str = ""


class QueryCmd(_Cmd, tag="query"):
    req: int
    queue: str
    group_by: list[str] = []
    aggregates: list[str] = []
    filter: str | None = None


ClientCommand = (
    Hello | Publish | Subscribe | Unsubscribe | Ack | Cancel | Expire | Extend | Heartbeat | Bye | Stats | Peek | Queues
    | QueryCmd | Claim | Replay | Admin | Range | Bounds | Release | Transact | TransactMany
)


# ------------------------------------------------------------ server -> client


class Welcome(_Cmd, tag="welcome"):
    version: int
    server: str
    heartbeat_ms: int
    max_message_bytes: int
    epoch: int = 0  # a cluster leader's epoch: clients that saw a newer one drop this session


class Confirm(_Cmd, tag="confirm"):
    req: int
    bookmarks: list[int]


class Subscribed(_Cmd, tag="subscribed"):
    req: int
    sub: str
    backlog: int
    group_header: str | None = "group"  # the queue's: what ``Message.group`` reads


class DeliverRaw(_Cmd, tag="deliver"):
    """DELIVER as the server encodes it: each message is its journal record, embedded
    unchanged (``zq.core.records.Message``: ["m", bookmark, ts_ms, topic, headers,
    payload, msg_id, copy_of]), with the delivery counts alongside."""

    sub: str
    records: list[msgspec.Raw]
    deliveries: list[int]


class DeliverRecords(_Cmd, tag="deliver"):
    """DELIVER as clients decode it (same bytes as ``DeliverRaw``)."""

    sub: str
    records: list[Message]
    deliveries: list[int]


class End(_Cmd, tag="end"):
    """A replay without ``follow`` has delivered all ``count`` messages it will."""

    sub: str
    count: int


class Records(_Cmd, tag="records"):
    """A RANGE answer: the records as stored, as one msgpack array in ``blob``; read on
    from ``next``; ``done`` when the range is exhausted. ``sizes``: each record's size
    in bytes (little-endian uint32s), so a reader can parse every record at once.
    ``blob`` decodes as a view into the received frame: megabytes, not copied again."""

    req: int
    kind: str
    blob: memoryview
    next: int
    done: bool
    sizes: bytes = b""


class Revoke(_Cmd, tag="revoke"):
    """A reclaimable subscription is asked for these deliveries back, if it has not
    started them: another consumer is idle. Answered with RELEASE."""

    sub: str
    bookmarks: list[int]
    epochs: list[int]


class Refused(_Cmd, tag="refused"):
    """Bookmarks of an ack / cancel / expire / extend that were not applied."""

    sub: str
    op: str
    bookmarks: list[int]
    reason: str


class Reply(_Cmd, tag="reply"):
    req: int
    data: Any


class Error(_Cmd, tag="error"):
    req: int  # 0 when the failing frame carried no request id
    code: str
    message: str


class Notice(_Cmd, tag="notice"):
    """What this connection's publishes wait for, in words: none of its confirmations held
    for ``code`` was sent for ``waited_ms`` (``zq.server.held``). Nothing to answer; the
    confirmations still come once the wait is over. Sent only to a session whose HELLO
    ``accepts`` it, once per reason every few seconds while the wait lasts."""

    code: str  # NOTICE_REPLICAS or NOTICE_FLOW
    message: str  # one line for a human: what is awaited, and what is there now
    held: int = 0  # this connection's PUBLISH frames waiting for it
    waited_ms: int = 0  # how long none of them was confirmed
    queue: str = ""  # flow-control: the queue over its limits


ServerCommand = (Welcome | Confirm | Subscribed | DeliverRecords | Refused | Reply | Error | Heartbeat | End | Records
                 | Revoke | Notice)


client_decoder = msgspec.msgpack.Decoder(ClientCommand)
server_decoder = msgspec.msgpack.Decoder(ServerCommand)
encoder = msgspec.msgpack.Encoder()
encode = encoder.encode

HEARTBEAT_FRAME = encode(Heartbeat())

# NOTICE: the optional frame a HELLO may accept, and its codes.
NOTICE = "notice"
NOTICE_REPLICAS = "replicas-ack"  # confirmations wait for standbys to have the messages on disk
NOTICE_FLOW = "flow-control"  # confirmations wait for a flow-control queue to drain below its limits

# Error codes that end a session: the client must say HELLO again and resubscribe.
RESET = "reset"  # the server dropped every session (reserved: zq itself no longer sends it, clients still obey it)
NO_SESSION = "no-session"  # the server does not know this peer (restarted, or no HELLO yet)
SESSION_ENDING = (RESET, NO_SESSION)
# A standby's answer to a client: it does not serve; the message ends with "leader: ENDPOINT".
NOT_LEADER = "not-leader"
LEADER_HINT = "leader: "


def leader_hint(message: str) -> str | None:
    """The leader's endpoint named by a ``not-leader`` ERROR, if it names one."""
    if LEADER_HINT not in message:
        return None
    hint = message.rpartition(LEADER_HINT)[2].strip()
    return hint if "://" in hint and "," not in hint and len(hint) <= 1024 else None
