"""Last-value queues: a newer message replaces the older available one of its key."""

from zq.core import QueueSettings
from zq.core import records as R
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness

LVQ = QueueSettings(name="prices", lvq_key="symbol", dead_letter="prices.dead")


def test_a_newer_value_replaces_the_older_available_one_recorded_as_replaced():
    h = Harness(LVQ)
    a1 = h.pub("prices", symbol="A")
    b1 = h.pub("prices", symbol="B")
    a2 = h.pub("prices", symbol="A")
    none = h.pub("prices", 2)  # without the key: never replaced
    h.drain()
    assert [s for s, _ in h.engine.peek("prices", 10)] == b1 + a2 + none
    replaced = [e for e in h.events(R.EXPIRED) if e.reason == "replaced"]
    assert [b for e in replaced for b in e.bookmarks] == a1
    assert "prices.dead" not in h.engine.queues or h.engine.queues["prices.dead"].depth == 0  # not a dead letter
    assert h.engine.stats()["queues"]["prices"]["replaced"] == 1


def test_a_leased_value_stays_with_its_holder_and_does_not_come_back_once_superseded():
    h = Harness(LVQ)
    old = h.pub("prices", symbol="A", payload=b"1")
    h.sub("w", "prices")
    assert h.drain() == {"w": old}
    new = h.pub("prices", symbol="A", payload=b"2")
    assert h.engine.queues["prices"].lease_of.get(old[0]) is not None  # not replaced under its holder
    h.engine.cancel("w", old, h.now)  # it would come back, but a newer value exists
    assert h.drain() == {"w": new}
    assert [b for e in h.events(R.EXPIRED) if e.reason == "replaced" for b in e.bookmarks] == old


def test_body_field_keys_and_recovery_keep_one_value_per_key():
    journal = MemoryJournal()
    settings = [QueueSettings(name="state", lvq_key="/device")]
    e = recover_engine(journal, settings)
    for i, dev in enumerate(["d1", "d2", "d1", "d1", "d2"]):
        e.publish("state", f'{{"device": "{dev}", "n": {i}}}'.encode(), {}, 0)
    journal.append(e.drain(0).records)
    journal.commit(0)
    assert len(e.peek("state", 10)) == 2
    again = recover_engine(journal, settings)
    assert [journal.get_message(s).payload for s, _ in again.peek("state", 10)] == [
        b'{"device": "d1", "n": 3}', b'{"device": "d2", "n": 4}']
