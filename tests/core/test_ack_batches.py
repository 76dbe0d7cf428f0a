"""Acks in batches take the engine's inline path (``Queue.ack_many``): they must leave
exactly what acking the same messages one at a time leaves, refusals included."""

import random
import types

import pytest

from zq.core import QueueSettings
from zq.core import records as R

from .helpers import Harness


def one_by_one(queue, sub, seqs, now_ms, epochs=None, stale=None):  # type: ignore[no-untyped-def]
    """The reference: every seq through ``Queue.ack``, the general path (fenced first,
    as ``ack_many``'s general path does)."""
    if epochs:
        seqs, fenced_off = queue.fence(sub, seqs, epochs)
        if stale is not None:
            stale.extend(fenced_off)
    return [seq for seq in seqs if queue.ack(sub, seq, now_ms) is not None]


def run(seed: int, batched: bool, fenced: bool = False, **settings) -> tuple:
    """The same random workload; acks sent as whole batches (the inline path), or one
    message per call through the general path."""
    rng = random.Random(seed)
    h = Harness(QueueSettings(name="jobs", max_per_subscription_backlog=8, lease_ms=10**6, **settings))
    if not batched:
        q = h.engine.queues["jobs"]
        q.ack_many = types.MethodType(one_by_one, q)
    for s in ("a", "b"):
        h.sub(s, "jobs", 8)
    held: dict[str, list[int]] = {"a": [], "b": []}
    refused: list[int] = []
    for _ in range(60):
        h.now += rng.choice((0, 0, 1, 3))  # several publishes share a millisecond
        h.pub("jobs", rng.randint(0, 6), group=rng.choice((None, None, "g1", "g2")))
        for s, seqs in h.drain().items():
            held[s].extend(seqs)
        for s in ("a", "b"):
            other = "b" if s == "a" else "a"
            take = rng.sample(held[s], rng.randint(0, len(held[s])))
            junk = rng.sample(held[other], min(1, len(held[other]))) + [10**9]  # not ours: refused
            batch = take + junk
            rng.shuffle(batch)
            held[s] = [x for x in held[s] if x not in take]
            if fenced:  # each delivery's epoch, a fifth of them stale (a late worker's)
                q = h.engine.queues["jobs"]
                epochs = [q.deliveries_of(seq) + (rng.random() < 0.2) for seq in batch]
                parts = [(batch, epochs)] if batched else [([b], [e]) for b, e in zip(batch, epochs)]
                for seqs, eps in parts:
                    for result, seqs_not_applied in h.engine.settle("ack", s, seqs, eps, h.now).items():
                        refused += [(result, seq) for seq in seqs_not_applied]
                        if result == "lost":  # not acked: still ours, to ack later
                            held[s] += [seq for seq in seqs_not_applied if seq in take]
            elif batched:
                refused += h.engine.ack(s, batch, h.now)
            else:
                for seq in batch:
                    refused += h.engine.ack(s, [seq], h.now)
    h.drain()
    st = h.engine.stats()["queues"]["jobs"]
    acks = sorted((e.consumer, b, d) for e in h.events(R.ACKED) for b, d in zip(e.bookmarks, e.deliveries))
    consumers = sorted((c["sub"], c["used"], c["acked"], c["busy_ms"]) for c in st["consumers"])
    return (sorted(refused), acks, st["acked"], st["depth"], st["leased"], st["ack_latency"], consumers)


# the default queue (messages with and without a group), exclusive groups, no group
# header at all, and a queue that keeps sizes (max_bytes: every ack on the general path)
KINDS = [{}, {"group_policy": "exclusive"}, {"group_header": None}, {"max_bytes": 10**9}]


@pytest.mark.interpreted_core
@pytest.mark.parametrize("settings", KINDS, ids=["default", "exclusive", "no-groups", "sized"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fenced", [False, True], ids=["unfenced", "fenced"])
def test_batched_acks_leave_what_single_acks_leave(seed, settings, fenced):
    batched, single = run(seed, True, fenced, **settings), run(seed, False, fenced, **settings)
    assert batched == single
    refused, acks = batched[0], batched[1]
    assert acks and refused  # the workload did ack, and did try foreign bookmarks


def test_acking_a_message_of_no_group_frees_credit_for_a_parked_exclusive_group():
    h = Harness(QueueSettings(name="jobs", group_policy="exclusive", max_per_subscription_backlog=2))
    first = h.pub("jobs", group="g1")[0]
    plain = h.pub("jobs")[0]
    second = h.pub("jobs", group="g1")[0]
    h.sub("s", "jobs", 2)
    assert h.drain() == {"s": [first, plain]}  # g1's next waits for its owner's credit
    assert h.engine.ack("s", [plain], h.now) == []
    assert h.drain() == {"s": [second]}
