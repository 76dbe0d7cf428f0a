"""qpid-python's transactional message-group tests (``qpid_tests/broker_0_10/msg_groups.py``:
``test_transaction``, ``test_send_transaction``), ported where the semantics match.

Qpid's transactional session collects acknowledgements (and sends) and applies them at
``commit``; ``rollback`` releases what the session acquired. In zq a consumer's
transaction is one call, ``Engine.transact`` (TX on the wire, ``sub.commit`` in the
clients): the acks a Qpid session collects are the bookmarks it names, applied at once
with its outputs, fenced. Until then the messages stay leased, so their groups stay held,
as Qpid's uncommitted acks keep them. A rollback is the consumer giving its deliveries
back (CANCEL with no delay): they go back to their places, and their groups are free.
A zq sender's transaction is a PUBLISH batch: journaled and visible whole, never in part;
a message not yet "committed" is one the sender has not sent.

The queue is Qpid's shared message group (``qpid.shared_msg_group``): zq's ``sequenced``
group policy. Qpid's ``fetch(0)`` with capacity 0 takes one message while holding others:
a claim of one (as ``test_the_qpid_sequenced_consumers_trace`` does)."""

from __future__ import annotations

from zq.core import QueueSettings

from .helpers import Harness


def group_queue() -> QueueSettings:
    return QueueSettings(name="msg-group-q", group_header="THE-GROUP", group_policy="sequenced", lease_ms=10**6,
                         max_per_subscription_backlog=100, backoff_ms=[])


class Qpid:
    """Two consumers fetching one message at a time, with Qpid's words for what they do."""

    def __init__(self) -> None:
        self.h = Harness(group_queue())
        self.name_of: dict[int, str] = {}
        self.seq_of: dict[str, int] = {}
        self.acked: dict[str, list[str]] = {"c1": [], "c2": []}  # acknowledged, not committed
        self.held: dict[str, list[str]] = {"c1": [], "c2": []}  # fetched, not yet settled

    def send(self, *names: str) -> None:
        """One sender commit: its messages as one PUBLISH batch (``index`` after the group)."""
        seqs = self.h.engine.publish_many("msg-group-q", [(b"", {"THE-GROUP": n[0]}, None) for n in names], self.h.now)
        for name, seq in zip(names, seqs):
            self.name_of[seq], self.seq_of[name] = name, seq

    def fetch(self, c: str) -> str | None:
        h = self.h
        h.engine.claim(c, "msg-group-q", c, 1, 10**6, h.now)
        got = h.drain()
        h.engine.end_claim(c)
        if not got:
            return None
        [seq] = got[c]
        self.held[c].append(self.name_of[seq])
        return self.name_of[seq]

    def acknowledge(self, c: str, *names: str) -> None:
        self.acked[c].extend(names or [n for n in self.held[c] if n not in self.acked[c]])

    def commit(self, c: str) -> None:
        names = self.acked[c]
        q = self.h.engine.queues["msg-group-q"]
        seqs = [self.seq_of[n] for n in names]
        assert self.h.engine.transact(c, "ack", seqs, [q.deliveries_of(s) for s in seqs], [], self.h.now) == ({}, [])
        self.held[c] = [n for n in self.held[c] if n not in names]
        self.acked[c] = []
        self.h.drain()

    def all_consumed(self, n: int) -> bool:
        q = self.h.engine.queues["msg-group-q"]
        return q.depth == 0 and not q.lease_of and q.acked == n

    def rollback(self, c: str) -> None:
        seqs = [self.seq_of[n] for n in self.held[c]]
        assert self.h.engine.cancel(c, seqs, self.h.now, delay_ms=0) == []
        self.held[c], self.acked[c] = [], []
        self.h.drain()


def test_transaction():
    """Acks take effect at commit; a rollback gives the session's messages back, and
    their groups go with them."""
    t = Qpid()
    t.send("A0", "A1", "B2", "B3", "A4", "B5")
    assert t.fetch("c1") == "A0"  # C1 gets group A
    assert t.fetch("c2") == "B2"  # C2 gets group B
    t.acknowledge("c1", "A0")
    t.acknowledge("c2", "B2")
    t.commit("c1")  # A-0 consumed: group A free
    t.rollback("c2")  # B-2 released, and group B
    assert t.fetch("c2") == "A1"  # C2 gets the next A
    assert t.fetch("c1") == "B2"  # C1 gets B-2
    t.acknowledge("c2", "A1")
    t.acknowledge("c1", "B2")
    t.commit("c1")  # B-2 consumed
    assert t.fetch("c1") == "B3"  # A-1 is C2's (not committed): B-3 is next for C1
    assert t.fetch("c2") == "A4"  # C2 owns group A
    t.acknowledge("c2", "A4")
    t.rollback("c2")  # released, with group A
    assert t.fetch("c1") == "A1"
    assert t.fetch("c2") is None  # C1 owns A and B
    assert t.fetch("c1") == "A4"
    t.acknowledge("c1")  # A-1, B-3, A-4: acknowledged, not yet committed
    assert t.fetch("c2") is None  # so B-5 is still held back
    t.commit("c1")
    assert t.fetch("c2") == "B5"
    t.acknowledge("c2")
    t.commit("c2")
    assert t.all_consumed(6)


def test_send_transaction():
    """What a sender has not committed (in zq: not sent) is nobody's; a consumer's
    rollback gives its group's messages to the other."""
    t = Qpid()
    t.send("A0", "B1")  # committed; A2 is not yet
    assert t.fetch("c1") == "A0"
    assert t.fetch("c2") == "B1"
    assert t.fetch("c1") is None and t.fetch("c2") is None  # A-2 uncommitted: nothing left
    t.send("A2")  # commit; B3 is not yet
    assert t.fetch("c2") is None  # B-3 uncommitted
    assert t.fetch("c1") == "A2"
    t.send("B3")  # commit
    assert t.fetch("c1") is None  # C1 is done
    assert t.fetch("c2") == "B3"  # C2 finds the new B
    t.rollback("c1")  # released
    assert t.fetch("c2") == "A0"
    assert t.fetch("c2") == "A2"
    t.acknowledge("c2")
    t.commit("c2")
    assert t.all_consumed(4)


def test_a_rollback_after_outputs_were_named_publishes_nothing_and_a_commit_publishes_them_once():
    """Beyond Qpid's tests, what a consumer transaction adds in zq: the outputs named with
    the acks are published at commit, never at a rollback, and once."""
    t = Qpid()
    t.send("A0", "A1")
    assert t.fetch("c1") == "A0"
    t.rollback("c1")  # nothing was sent with it
    assert "out" not in t.h.engine.queues
    assert t.fetch("c2") == "A0"
    seq = t.seq_of["A0"]
    q = t.h.engine.queues["msg-group-q"]
    refused, [[out]] = t.h.engine.transact("c2", "ack", [seq], [q.deliveries_of(seq)], [("out", [(b"x", {}, None)])],
                                           t.h.now)
    assert refused == {} and t.h.engine.queues["out"].depth == 1
    assert t.fetch("c1") == "A1"  # the group moved on with the commit
