"""Bulk operator actions run in slices (``limits.BULK_SLICE`` messages read each) so the
dispatcher serves everyone between them: a sliced purge, move, ack-filter or redrive
takes exactly what one pass over the queue would, whatever the queue's kind and the
state of its messages (waiting, returned, set aside, in groups, leased)."""

import random

import pytest

from zq.core import QueueSettings, limits
from zq.core import records as R
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness

KINDS = {
    "fifo": dict(),
    "sequenced groups": dict(group_policy="sequenced"),
    "priority": dict(priority="p"),
    "priority groups": dict(priority="p", group_policy="sequenced"),
    "exclusive groups": dict(group_policy="exclusive"),
}


def busy_queue(kind: str, seed: int) -> tuple[Harness, MemoryJournal]:
    """A queue with messages in every state: waiting, leased, returned after a cancel,
    set aside by a filtered subscriber, in groups or not."""
    rnd = random.Random(seed)
    h = Harness(QueueSettings(name="q", lease_ms=1000, max_deliveries=0, **KINDS[kind]))
    journal = MemoryJournal()
    for _ in range(120):
        group = rnd.choice([None, "a", "b", "c"])
        h.pub("q", 1, group=group, k=str(rnd.randrange(4)), p=str(rnd.randrange(3)))
    h.sub("picky", "q", backlog=5, filter="k = '3'")
    h.sub("any", "q", backlog=30)
    got = h.commit_to(journal)
    for sub_id, seqs in got.items():
        h.engine.cancel(sub_id, seqs[: len(seqs) // 2], h.now)  # back into the queue, out of order
    h.engine.unsubscribe("any", h.now)  # the rest of its leases too
    h.commit_to(journal)
    # The filtered subscriber keeps its leases and takes nothing more: between slices the
    # queue dispatches as usual, and what it leased there would not be the purge's.
    h.engine.replace("picky", "q", 5, "k = 'none'", h.now)
    return h, journal


def waiting(h: Harness) -> list[int]:
    return sorted(s for s, _ in h.engine.peek("q", limits.VIEW_SCAN_MAX))


def matching(h: Harness, filter: str) -> list[int]:
    return sorted(s for s, _ in h.engine.peek("q", limits.VIEW_SCAN_MAX, filter))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("what", [{"filter": "k = '1' OR k = '2'"}, {"group": "a"}, {}])
def test_a_purge_in_slices_takes_what_one_pass_would_and_every_count_agrees(kind, seed, what, monkeypatch):
    whole, _ = busy_queue(kind, seed)
    expected = matching(whole, "k = '1' OR k = '2'" if "filter" in what else "group = 'a'" if what else "TRUE")
    assert whole.engine.purge("q", whole.now, **what) == len(expected)
    monkeypatch.setattr(limits, "BULK_SLICE", 3)
    h, journal = busy_queue(kind, seed)
    before = waiting(h)
    cursor = h.engine.bulk_cursor()
    slices = total = 0
    while not cursor.done:
        total += h.engine.purge("q", h.now, **what, cursor=cursor)
        slices += 1
        h.commit_to(journal)
    assert slices >= len(expected) // 3 and total == len(expected)
    q = h.engine.queues["q"]
    assert waiting(h) == sorted(set(before) - set(expected)) == waiting(whole)
    assert q.depth == len(waiting(h))
    pending = {row["group"]: row["pending"] for row in h.engine.group_list("q")}
    for name, gid in q.gid_of.items():
        assert pending.get(name, 0) == len([s for s in waiting(h) if q.group_name_of(s) == name or
                                            h.journaled[s].headers.get("group") == name]), name
    again = recover_engine(journal, [q.settings])  # (leases end with a restart: those wait again)
    assert sorted(s for s, _ in again.peek("q", limits.VIEW_SCAN_MAX)) == sorted(waiting(h) + list(q.lease_of))


def test_a_slice_leaves_what_was_published_after_the_action_began(monkeypatch):
    monkeypatch.setattr(limits, "BULK_SLICE", 2)
    h = Harness()
    old = h.pub("q", 5)
    h.drain()
    cursor = h.engine.bulk_cursor()
    assert h.engine.purge("q", h.now, cursor=cursor) == 2
    new = h.pub("q", 3)
    while not cursor.done:
        h.engine.purge("q", h.now, cursor=cursor)
    h.drain()
    assert waiting(h) == new
    assert sorted(b for e in h.events(R.EXPIRED) for b in e.bookmarks) == old


def test_move_ack_filter_and_redrive_in_slices(monkeypatch):
    monkeypatch.setattr(limits, "BULK_SLICE", 4)
    h = Harness(QueueSettings(name="q"), QueueSettings(name="shared", leasing="shared"))
    h.pub("q", 10, kind="x")
    h.pub("q", 10, kind="y")
    assert h.engine.move("q", "elsewhere", h.now, filter="kind = 'x'") == 10
    h.drain()
    assert len(h.engine.peek("elsewhere", 100)) == 10 and len(waiting(h)) == 10
    h.pub("shared", 9, kind="x")
    h.sub("w", "shared", backlog=3)
    h.drain()
    assert h.engine.ack_filter("shared", "kind = 'x'", "admin", h.now) == 9  # 3 leased, 6 waiting
    assert h.engine.redrive("q", h.now) == 0  # no zq.topic header: not a dead letter
