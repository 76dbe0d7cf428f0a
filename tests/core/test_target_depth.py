"""TargetQueueDepth: only the first N messages of a queue are in memory."""

import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.errors import ConfigError
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness

TQD = QueueSettings(name="deep", target_queue_depth=3, allow_ack_unleased=True)


def work_through(h: Harness, sub: str, steps: int, each=lambda: True) -> list[int]:  # type: ignore[no-untyped-def]
    """A worker that acks everything it gets, for ``steps`` steps; ``each`` must hold after every step."""
    got: list[int] = []
    for _ in range(steps):
        out = h.drain().get(sub, [])
        got += out
        h.engine.ack(sub, out, h.now)
        assert each()
    return got


def test_only_the_first_n_are_active_and_the_rest_are_read_in_as_the_queue_drains():
    h = Harness(TQD)
    seqs = h.pub("deep", 10)
    h.drain()
    q = h.engine.queues["deep"]
    assert (q.depth, q.target.inactive) == (3, 7)
    assert [s for s, _ in h.engine.peek("deep", 100)] == seqs[:3]  # views see the active part
    stats = h.engine.stats()["queues"]["deep"]
    assert (stats["depth"], stats["inactive"], stats["kind"]) == (3, 7, "tqd=3")
    h.sub("w", "deep", backlog=2)
    got = work_through(h, "w", steps=20, each=lambda: q.active() <= 3)
    assert got == seqs  # in order, nothing lost, nothing twice
    assert (q.depth, q.target.inactive, len(q.lease_of)) == (0, 0, 0)
    h.drain()
    more = h.pub("deep", 2)  # an empty queue admits directly again
    assert (q.active(), q.target.inactive) == (2, 0)
    assert h.drain() == {"w": more}


def test_acks_for_messages_not_yet_active_are_remembered_and_honoured():
    h = Harness(TQD)
    seqs = h.pub("deep", 6)
    h.drain()
    h.sub("w", "deep", backlog=10)
    assert h.engine.ack("w", [seqs[4]], h.now) == []  # inactive: acknowledged early
    assert h.engine.queues["deep"].target.inactive == 2
    got = h.drain().get("w", [])
    assert [e.bookmarks for e in h.events(R.ACKED)] == [[seqs[4]]]
    for _ in range(5):
        h.engine.ack("w", got[-3:], h.now)
        got += h.drain().get("w", [])
    assert got == [s for s in seqs if s != seqs[4]]  # the early-acked one never comes


def test_recovery_keeps_the_split_and_the_early_acks():
    journal = MemoryJournal()
    e = recover_engine(journal, [TQD])
    seqs = [e.publish("deep", b"x", {}, 0) for _ in range(8)]
    journal.append(e.drain(0).records)
    journal.commit(0)
    e.subscribe("w", "deep", "w", 1, 0)
    assert e.ack("w", [seqs[6]], 0) == []  # early ack, journaled
    out = e.drain(0)
    journal.append(out.records)
    journal.commit(0)
    again = recover_engine(journal, [TQD])
    q = again.queues["deep"]
    assert (q.depth, q.target.inactive, q.target.early_acks) == (3, 4, {seqs[6]})
    again.subscribe("w", "deep", "w", 10, 0)
    got = []
    for _ in range(10):
        out = again.drain(0)
        journal.append(out.records)
        journal.commit(0)
        for d in out.deliveries:
            got += d.seqs
            again.ack("w", d.seqs, 0)
    assert got == [s for s in seqs if s != seqs[6]]


def test_dead_letters_into_a_target_depth_queue_wait_their_turn():
    h = Harness(QueueSettings(name="src", dead_letter="dlq", max_deliveries=1),
                QueueSettings(name="dlq", target_queue_depth=1))
    seqs = h.pub("src", 3)
    h.sub("w", "src", backlog=3)
    assert h.drain() == {"w": seqs}
    h.engine.cancel("w", seqs, h.now)  # out of deliveries: dead-lettered
    h.drain()
    dlq = h.engine.queues["dlq"]
    assert (dlq.depth, dlq.target.inactive) == (1, 2)
    h.sub("d", "dlq", backlog=5)
    got = work_through(h, "d", steps=5)
    assert len(got) == 3 and got == sorted(got)


@pytest.mark.parametrize("kind", [dict(priority="p"), dict(barrier="b = 1"), dict(sort_key="k"),
                                  dict(lvq_key="k"), dict(browse_only=True)])
def test_target_depth_refuses_kinds_that_need_every_message_in_memory(kind):
    with pytest.raises(ConfigError, match="target_queue_depth cannot be combined"):
        QueueSettings(name="q", target_queue_depth=5, **kind).validate()


def test_a_refill_behind_many_other_records_goes_on_over_several_steps_without_stalling_one():
    h = Harness(QueueSettings(name="deep", target_queue_depth=1), QueueSettings(name="busy"))
    first = h.pub("deep")
    h.sub("w", "deep", backlog=1)
    assert h.drain() == {"w": first}
    h.pub("deep", 2)  # journal-only: the one in memory is leased
    h.drain()
    h.pub("busy", 5000)  # another topic's records between the cursor and ...
    last = h.pub("deep", 3)  # ... these, journal-only too
    h.drain()
    q = h.engine.queues["deep"]
    assert q.target.inactive == 5
    got = list(first)
    steps = budget_hit = 0
    while len(got) < 6 and steps < 50:
        steps += 1
        h.engine.ack("w", got[-1:], h.now)
        out = h.drain().get("w", [])
        got += out
        if q.target.scanning:  # the step stopped at its scan budget and asks to run again at once
            budget_hit += 1
            assert h.engine.next_deadline_ms() == h.now
    assert got[-3:] == last and len(got) == 6 and budget_hit >= 1
