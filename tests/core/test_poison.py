"""Poison: a message whose content cannot be evaluated fails alone (issue 31 §1).

Bodies that the decoders cannot read (strings that are not valid UTF-8, nesting past
the decoder's depth) used to raise out of every evaluator: a filter killed the loop, and
a priority, sort key or last-value key answered ``internal`` after the message was
journaled, so that every later start died on it. Now a filter is FALSE for such a
message, and a queue that must evaluate it to place it sets it aside as poison:
dead-lettered with ``zq.reason = poison`` and the error, counted, journaled, and the
same at recovery.
"""

import msgspec
import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.expr import Unevaluable, compile_filter, compile_value
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness

BAD_UTF8_MSGPACK = b"\x81\xa1k\xa2\xff\xfe"  # {"k": <invalid UTF-8>}
BAD_UTF8_JSON = b'{"k": "\xff\xfe"}'
DEEP_JSON = b'{"k": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
DEEP_MSGPACK = b"\x81\xa1k" + b"\x91" * 200_000 + b"\x90"
POISONS = {"bad-utf8-msgpack": (BAD_UTF8_MSGPACK, "UnicodeDecodeError"),
           "bad-utf8-json": (BAD_UTF8_JSON, "UnicodeDecodeError"),
           "deep-json": (DEEP_JSON, "RecursionError"), "deep-msgpack": (DEEP_MSGPACK, "RecursionError")}

KINDS = {
    "priority": QueueSettings(name="q", priority="/k", dead_letter="q.dead"),
    "sort_key": QueueSettings(name="q", sort_key="/k", dead_letter="q.dead"),
    "lvq_key": QueueSettings(name="q", lvq_key="/k", dead_letter="q.dead"),
    "fair-priority": QueueSettings(name="q", tenant_header="tenant", priority="/k", dead_letter="q.dead"),
}


def good(k: int) -> bytes:
    return msgspec.json.encode({"k": k})


@pytest.mark.parametrize("body", POISONS, ids=list(POISONS))
def test_expressions_are_total_a_filter_is_false_and_a_value_raises_unevaluable(body):
    payload, cause = POISONS[body]
    assert compile_filter("/k = 1")({}, payload) is False
    assert compile_filter("NOT (/k = 1)")({}, payload) is False  # not matching, whichever way it is asked
    with pytest.raises(Unevaluable, match=cause):
        compile_value("/k")({}, payload)
    with pytest.raises(Unevaluable, match=cause):
        compile_value("/k * 2")({}, payload)


@pytest.mark.parametrize("kind", KINDS, ids=list(KINDS))
@pytest.mark.parametrize("body", POISONS, ids=list(POISONS))
def test_a_message_a_queue_cannot_evaluate_is_set_aside_as_poison_and_fails_alone(kind, body):
    payload, cause = POISONS[body]
    h = Harness(KINDS[kind])
    before = h.pub("q", payload=good(1), tenant="a")
    bad = h.pub("q", payload=payload, tenant="a")  # accepted: a publish is refused before it is journaled, or taken
    after = h.pub("q", payload=good(2), tenant="b")
    h.drain()
    assert sorted(s for s, _ in h.engine.peek("q", 10)) == before + after
    [event] = [e for e in h.events(R.EXPIRED) if e.queue == "q"]
    assert (event.bookmarks, event.reason) == (bad, R.REASON_POISON)
    assert len(event.errors) == 1 and event.errors[0].startswith(cause)
    [dead] = [m for m in h.journaled.values() if m.topic == "q.dead"]
    assert dead.headers["zq.reason"] == "poison" and dead.headers["zq.error"].startswith(cause)
    assert dead.headers["zq.bookmark"] == str(bad[0]) and dead.payload == payload
    q = h.engine.stats()["queues"]["q"]
    assert (q["poisoned"], q["expired"], q["dead_lettered"], q["depth"]) == (1, 1, 1, 2)
    if kind == "fair-priority":  # the tenant's tag and count did not move for a message that never entered
        assert {t["tenant"]: t["held"] for t in q["tenants"]} == {"a": 1, "b": 1}
    h.sub("w", "q", backlog=10)
    assert sorted(h.drain()["w"]) == before + after  # the rest flows


def test_a_filter_that_cannot_read_a_body_does_not_match_it_anywhere():
    h = Harness(QueueSettings(name="q", filter="/k > 0", dead_letter="q.dead"), QueueSettings(name="all"))
    ok = h.pub("q", payload=good(1))
    for payload, _ in POISONS.values():
        h.pub("q", payload=payload)
    h.pub("all", payload=BAD_UTF8_MSGPACK)
    h.drain()
    assert [s for s, _ in h.engine.peek("q", 10)] == ok  # not matching: not in the queue, and not poison
    assert h.engine.stats()["queues"]["q"]["poisoned"] == 0
    h.sub("f", "all", backlog=10, filter="/k = 1")  # a subscription's filter, peek, purge with filters
    assert h.drain() == {}
    assert h.engine.peek("all", 10, filter="/k = 1") == []
    assert len(h.engine.peek("all", 10, filter="NOT (/k = 1) OR /k IS NULL")) == 0  # unreadable: never matches


def test_a_query_counts_an_unreadable_value_as_null():
    h = Harness(QueueSettings(name="q"))
    h.pub("q", payload=good(3), x="1.5")
    h.pub("q", payload=good(4), x="9" * 400)  # an integer beyond a float: its sum with 1.5 overflows
    for payload, _ in POISONS.values():
        h.pub("q", payload=payload)
    h.drain()
    [row] = h.engine.query("q", [], ["count", "count(/k)", "sum(/k)", "max(/k * 2)", "sum(x)", "max(x * 2.5)"])["rows"]
    assert (row["count"], row["count(/k)"], row["sum(/k)"], row["max(/k * 2)"]) == (6, 2, 7, 8)
    assert row["sum(x)"] == float("inf") and row["max(x * 2.5)"] == 3.75  # the unreadable product is NULL
    rows = h.engine.query("q", ["/k"], ["count"])["rows"]
    assert {r["/k"]: r["count"] for r in rows} == {3: 1, 4: 1, None: 4}


def test_recovery_sets_aside_poison_a_previous_zq_journaled_and_says_so_once():
    """A journal written by a zq that let poison in (no ``expired`` event for it): recovery
    must neither die nor lose the rest; the message is dead-lettered once, and a second
    restart finds it settled."""
    settings = [QueueSettings(name="q", priority="/k", dead_letter="q.dead")]
    journal = MemoryJournal()
    journal.append([R.Message(1, 0, "q", {}, good(1)), R.Message(2, 0, "q", {}, DEEP_MSGPACK),
                    R.Message(3, 0, "q", {}, BAD_UTF8_JSON), R.Message(4, 0, "q", {}, good(9))])
    journal.commit(0)
    eng = recover_engine(journal, settings)
    out = eng.drain(0)
    journal.append(out.records)
    journal.commit(0)
    assert [s for s, _ in eng.peek("q", 10)] == [4, 1]  # by priority, the rest intact
    assert any("set aside as poison" in n and "bookmark 2" in n for n in eng.notices)
    expired = [r for r in out.records if type(r) is R.Event and r.kind == R.EXPIRED]
    assert [(e.bookmarks, e.reason) for e in expired] == [([2, 3], "poison")]
    assert eng.stats()["queues"]["q"]["poisoned"] == 2
    dead = [journal.get_message(s) for s, _ in eng.peek("q.dead", 10)]
    assert [m.headers["zq.bookmark"] for m in dead] == ["2", "3"]
    assert dead[0].headers["zq.error"].startswith("RecursionError")
    again = recover_engine(journal, settings)
    assert not any(type(r) is R.Event and r.kind == R.EXPIRED for r in again.drain(0).records)
    assert [s for s, _ in again.peek("q", 10)] == [4, 1]
    assert [s for s, _ in again.peek("q.dead", 10)] == [s for s, _ in eng.peek("q.dead", 10)]  # not twice


def test_a_copy_moved_into_an_ordered_queue_that_cannot_evaluate_it_is_poison_there():
    """Dead letters, moves and redrives enter their queue through ``enqueue_copy``: a
    priority dead-letter queue that cannot read a body sets it aside too (one step)."""
    h = Harness(QueueSettings(name="q", lvq_key="/k", dead_letter="dlq"),
                QueueSettings(name="dlq", priority="/k", dead_letter="dlq2"), QueueSettings(name="dlq2"))
    h.pub("q", payload=BAD_UTF8_MSGPACK)
    h.drain()
    stats = h.engine.stats()["queues"]
    assert stats["q"]["poisoned"] == 1 and stats["dlq"]["poisoned"] == 1 and stats["dlq2"]["depth"] == 1
