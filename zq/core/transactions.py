"""Settle and publish in one commit: a worker's ack (or cancel) of what it took, with the
messages it produced, applied whole or not at all.

Why it is simple here: the engine's records of one step are appended and committed in
one journal transaction by the adapter, so what one call of ``transact`` does is
committed together or not at all. What this module adds is *deciding before doing*:
every input delivery must be the live one (fenced by its epoch, ``settling.fence``)
and every output must be one its topic takes (``Admission.check``), or nothing
happens. Only then are the outputs published and the inputs settled; neither can fail
after the checks (publishing removes no leased message, and the checks ran on the
same state).

Order in the journal: the outputs take their bookmarks when published, the settle's
events theirs when the step drains, so every output precedes the settle. A copy of a
prefix of the journal (a standby's, ``zq.server.standby``) may hold the outputs without
the settle, never the settle without its outputs; then the input is delivered again,
and its outputs, published again under the same derived ids (``derived_id``), are
absorbed by the dedup window: each output is stored once. (A cancel's outputs name the
delivery they cancel, so that case may store a cancel's outputs twice: a failure
notice, never work.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zq.core import limits, settling
from zq.core.errors import LimitError, ProtocolError, ZqError
from zq.core.leases import D_MASK

if TYPE_CHECKING:
    from zq.core.engine import Engine
    from zq.core.queue import Queue, Subscription

Items = list[tuple[bytes, dict[str, str], str | None]]

OPS = ("ack", "cancel")
OUTPUTS_MAX = 64  # topics one transaction publishes to (each may carry many messages)


DERIVED_PREFIX = "zq:"  # derived ids' namespace: a client may not give such an id (zq.server.commands)


def derived_id(queue: str, bookmark: int, index: int, cancel_of: int = 0) -> str:
    """An output's message id when its producer gave none: the input's queue and
    bookmark and the output's place in the transaction. An ack's outputs leave out the
    delivery count: an input is acked once, and a redelivery after a lost answer (or a
    standby's copy holding the outputs without the ack) must produce the same ids, to be
    absorbed. A cancel's (``cancel_of``: the delivery count cancelled) name it: an input
    may be cancelled with outputs again and again, then acked, and each of those is new
    work, never a repeat of the last (the same id would have the dedup window drop an
    ack's real output after a cancel's notice)."""
    if cancel_of:
        return f"{DERIVED_PREFIX}{queue}:{bookmark}:{index}:c{cancel_of}"
    return f"{DERIVED_PREFIX}{queue}:{bookmark}:{index}"


def not_live(q: Queue, sub: Subscription, seqs: list[int], epochs: list[int], next_seq: int) -> dict[str, list[int]]:
    """The inputs that are not this subscription's live deliveries, by the result a
    settle of each would get (``lost``, ``done``, ``dead``, ``unknown``). Looks only."""
    results: dict[str, list[int]] = {}
    lease_of, meta = q.lease_of, q.meta
    for seq, epoch in zip(seqs, epochs):
        lease = lease_of.get(seq)
        if lease is not None and lease.sub is sub:
            if meta[seq] & D_MASK == epoch:
                continue  # live
            results.setdefault("lost", []).append(seq)
        else:
            results.setdefault(settling.settle_result(q, seq, next_seq), []).append(seq)
    return results


def with_ids(queue: str, first: int, outputs: list[tuple[str, Items]], cancel_of: int = 0) -> list[tuple[str, Items]]:
    """Each output without a message id gets its derived one."""
    out: list[tuple[str, Items]] = []
    index = 0
    for topic, items in outputs:
        named: Items = []
        for payload, headers, msg_id in items:
            named.append((payload, headers, msg_id if msg_id is not None else derived_id(queue, first, index, cancel_of)))
            index += 1
        out.append((topic, named))
    return out


def check_shape(op: str, seqs: list[int], epochs: list[int], outputs: list[tuple[str, Items]], delay_ms: int,
                error: str) -> None:
    if op not in OPS:
        raise ProtocolError(f"a transaction settles with ack or cancel, not {op!r}")
    if not seqs:
        raise ProtocolError("a transaction settles at least one delivery")
    if len(seqs) > limits.ACK_BATCH_MAX:
        raise LimitError(f"at most {limits.ACK_BATCH_MAX} bookmarks in one transaction")
    if len(epochs) != len(seqs):
        raise ProtocolError(f"a transaction is fenced: {len(epochs)} epochs for {len(seqs)} bookmarks")
    if len(set(seqs)) != len(seqs):
        raise ProtocolError("a transaction names a bookmark twice")
    if len(outputs) > OUTPUTS_MAX:
        raise LimitError(f"at most {OUTPUTS_MAX} outputs (topics) in one transaction")
    if sum(len(items) for _, items in outputs) > limits.PUBLISH_BATCH_MAX:
        raise LimitError(f"at most {limits.PUBLISH_BATCH_MAX} messages published by one transaction")
    if op == "cancel":
        if not -1 <= delay_ms <= limits.DURATION_MS_MAX:
            raise ProtocolError(f"a cancel's delay must be 0..{limits.DURATION_MS_MAX} ms (-1: the queue's backoff)")
        if len(error) > limits.ERROR_TEXT_MAX:
            raise ProtocolError(f"a cancel's error is at most {limits.ERROR_TEXT_MAX} characters")


def transact(engine: Engine, sub_id: str, op: str, seqs: list[int], epochs: list[int],
             outputs: list[tuple[str, Items]], now_ms: int, max_message_bytes: int = limits.MESSAGE_BYTES_MAX,
             delay_ms: int = -1, error: str = "") -> tuple[dict[str, list[int]], list[list[int]]]:
    """Settle ``seqs`` (delivered to ``sub_id`` with ``epochs``) by ``op`` and publish
    ``outputs`` ([(topic, [(payload, headers, msg_id)])]), all or nothing.

    Returns ``(not_applied, bookmarks)``: when every input is live, ``not_applied`` is
    empty and ``bookmarks`` gives each output's bookmarks (a duplicate's first one);
    otherwise nothing happened, ``not_applied`` says why for each input that is not
    live, and ``bookmarks`` is empty. A bad output raises (``ZqError``) before anything
    happens."""
    check_shape(op, seqs, epochs, outputs, delay_ms, error)
    engine.set_time(now_ms)
    sub = engine.sub(sub_id)
    q = sub.queue
    if q.browse:
        raise ProtocolError(f"queue {q.name!r} is browse-only: it has no deliveries to settle in a transaction")
    refused = not_live(q, sub, seqs, epochs, engine.next_seq)
    if refused:
        lost = refused.get("lost")
        if lost:
            q.lost_settles += len(lost)
        q.transactions_refused += 1
        return refused, []
    named = with_ids(q.name, seqs[0], outputs, epochs[0] if op == "cancel" else 0)
    admission = engine.admission
    try:
        admission.check(named, now_ms, max_message_bytes)
    except ZqError:
        q.transactions_refused += 1
        raise
    bookmarks = [admission.publish_many(topic, items, now_ms, max_message_bytes) if items else []
                 for topic, items in named]
    late = engine.settle(op, sub_id, seqs, epochs, now_ms, 0, delay_ms, error)
    if late:  # cannot be: the same state was checked above (a bug, answered as one)
        raise AssertionError(f"a transaction's inputs were live, then not: {late}")
    q.transactions += 1
    return {}, bookmarks
