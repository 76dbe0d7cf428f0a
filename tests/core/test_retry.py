"""Retry schedules, cancels that name their delay, delayed publishes and parked groups."""

import math

import pytest

from zq.core import QueueSettings, delaying
from zq.core import records as R
from zq.core.errors import ConfigError, ProtocolError
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness


def queue(**kw) -> QueueSettings:
    kw.setdefault("backoff_jitter", 0.0)
    return QueueSettings(name="jobs", lease_ms=10**6, max_per_subscription_backlog=10, **kw)


def test_a_cancelled_message_waits_for_each_step_of_the_schedule_then_the_last_repeats():
    h = Harness(queue(backoff_ms=[100, 1000]))
    [m] = h.pub("jobs")
    h.sub("w", "jobs", 1)
    waits = []
    for _ in range(4):
        assert h.drain() == {"w": [m]}
        h.engine.cancel("w", [m], h.now)
        start = h.now
        while not h.drain():
            h.advance(10)
        waits.append(h.now - start)  # (the loop delivered it on the drain after the due tick)
        h.engine.cancel("w", [m], h.now, 0)  # hand it back at once for the next round's delivery
    assert waits == [100, 1000, 1000, 1000]


def test_jitter_spreads_waits_within_bounds_and_is_a_function_of_the_message():
    h = Harness(queue(backoff_ms=[1000], backoff_jitter=0.2))
    q = h.engine.queues["jobs"]
    waits = [delaying.retry_delay_ms(q, seq, 1) for seq in range(1, 2001)]
    assert min(waits) >= 800 and max(waits) <= 1200
    assert len(set(waits)) > 300  # spread out, not a few values
    assert abs(sum(waits) / len(waits) - 1000) < 20
    assert waits == [delaying.retry_delay_ms(q, seq, 1) for seq in range(1, 2001)]  # deterministic


def test_a_cancel_names_its_own_delay_or_none():
    h = Harness(queue(backoff_ms=[10_000]))
    a, b = h.pub("jobs", 2)
    h.sub("w", "jobs", 2)
    assert h.drain() == {"w": [a, b]}
    h.engine.cancel("w", [a], h.now, 0)  # at once, schedule or not
    h.engine.cancel("w", [b], h.now, 50)
    assert h.drain() == {"w": [a]}
    h.advance(49)
    assert h.drain() == {}
    h.advance(1)
    assert h.drain() == {"w": [b]}
    reasons = {e.reason: (e.bookmarks, e.due_ms) for e in h.events(R.DELAYED)}
    assert reasons == {R.DELAY_REQUESTED: ([b], [50])}


def test_lease_expiry_waits_for_the_schedule_and_a_vanished_consumer_does_not():
    h = Harness(QueueSettings(name="jobs", lease_ms=100, backoff_ms=[500], backoff_jitter=0.0))
    a, b = h.pub("jobs", 2)
    h.sub("w", "jobs", 1)
    assert h.drain() == {"w": [a]}
    h.advance(100)  # lease expired: a waits 500 ms; b goes now
    assert h.drain() == {"w": [b]}
    h.engine.disconnect("w", h.now)  # b's consumer is gone: b may go at once
    h.sub("v", "jobs", 2)
    assert h.drain() == {"v": [b]}
    h.engine.ack("v", [b], h.now)
    h.advance(499)
    assert h.drain() == {}
    h.advance(1)
    assert h.drain() == {"v": [a]}
    assert h.engine.stats()["queues"]["jobs"]["retries_delayed"] == 1


def test_a_parked_group_holds_only_itself():
    h = Harness(queue(backoff_ms=[1000], group_policy="sequenced"))
    a1, b1, a2, b2 = (h.pub("jobs", group=g)[0] for g in ("A", "B", "A", "B"))
    h.sub("w", "jobs", 1)
    h.sub("v", "jobs", 1)
    got = h.drain()
    assert sorted(got["w"] + got["v"]) == [a1, b1]
    holder_a = "w" if got["w"] == [a1] else "v"
    holder_b = "v" if holder_a == "w" else "w"
    h.engine.cancel(holder_a, [a1], h.now)  # A parks behind a1 for 1 s
    h.engine.ack(holder_b, [b1], h.now)
    got = h.drain()
    assert sorted(s for v in got.values() for s in v) == [b2]  # B goes on; a2 waits behind a1
    assert h.engine.stats()["queues"]["jobs"]["delayed"] == 1
    h.advance(999)
    assert h.drain() == {}
    h.advance(1)
    got = h.drain()
    assert [s for v in got.values() for s in v] == [a1]  # the group's order is kept: a1 before a2
    who = next(iter(got))
    h.engine.ack(who, [a1], h.now)
    got = h.drain()
    assert [s for v in got.values() for s in v] == [a2]


def test_a_delayed_publish_waits_and_holds_only_the_later_messages_of_its_group():
    h = Harness(queue())
    early = h.pub("jobs", group="A")[0]
    late = h.engine.publish("jobs", b"x", {"group": "A"}, h.now, not_before_ms=h.now + 300)
    after = h.pub("jobs", group="A")[0]
    other = h.pub("jobs", group="B")[0]
    plain = h.engine.publish("jobs", b"x", {}, h.now, not_before_ms=h.now + 200)
    h.sub("w", "jobs", 10)
    assert h.drain() == {"w": [early, other]}
    h.engine.ack("w", [early, other], h.now)
    assert h.drain() == {}  # A: ``late`` parks the group, ``after`` waits behind it
    h.advance(200)
    assert h.drain() == {"w": [plain]}
    h.advance(100)
    assert h.drain() == {"w": [late, after]}  # in order (a sequenced group's holder takes as its credit allows)
    [ev] = [e for e in h.events(R.DELAYED)]  # one event per queue and reason per step
    assert ev.reason == R.DELAY_PUBLISHED and sorted(ev.bookmarks) == [late, plain]


def test_a_delayed_publish_to_a_priority_queue_waits_then_competes_by_rank():
    h = Harness(queue(priority="prio"))
    low = h.engine.publish("jobs", b"x", {"prio": "1"}, h.now)
    high = h.engine.publish("jobs", b"x", {"prio": "9"}, h.now, not_before_ms=h.now + 100)
    h.sub("w", "jobs", 1)
    assert h.drain() == {"w": [low]}
    h.engine.cancel("w", [low], h.now, 0)
    assert h.drain() == {"w": [low]}
    h.engine.cancel("w", [low], h.now, 0)
    h.advance(100)
    assert h.drain() == {"w": [high]}


def test_a_restart_keeps_the_rest_of_each_wait(tmp_path):
    settings = queue(backoff_ms=[1000], group_policy="sequenced")
    j = MemoryJournal()
    h = Harness(settings)
    h.now = 10_000
    a = h.pub("jobs", group="A")[0]
    a2 = h.pub("jobs", group="A")[0]
    b = h.engine.publish("jobs", b"x", {}, h.now, not_before_ms=h.now + 700)
    h.sub("w", "jobs", 1)
    assert h.commit_to(j) == {"w": [a]}
    h.engine.cancel("w", [a], h.now)  # due at 11,000
    h.commit_to(j)
    h2 = Harness(settings)
    h2.engine = recover_engine(j, [settings])
    h2.now = 10_600
    h2.engine.advance(h2.now)
    h2.sub("v", "jobs", 5)
    assert h2.drain() == {}  # a waits (and parks A: a2 behind it), b waits
    h2.advance(100)
    assert h2.drain() == {"v": [b]}
    h2.advance(299)
    assert h2.drain() == {}
    h2.advance(1)
    assert h2.drain() == {"v": [a, a2]}  # the group goes on, in order
    assert h2.engine.queues["jobs"].deliveries_of(a) == 2


def test_a_delivery_after_the_delay_ends_it_for_recovery():
    """A message delayed, then delivered: a restart must not delay it again."""
    settings = queue(backoff_ms=[100])
    j = MemoryJournal()
    h = Harness(settings)
    h.now = 5_000
    [a] = h.pub("jobs")
    h.sub("w", "jobs", 1)
    h.commit_to(j)
    h.engine.cancel("w", [a], h.now)
    h.commit_to(j)
    h.advance(100)
    assert h.commit_to(j) == {"w": [a]}
    h2 = Harness(settings)
    h2.engine = recover_engine(j, [settings])
    h2.now = h.now
    h2.engine.advance(h2.now)
    h2.sub("v", "jobs", 1)
    assert h2.drain() == {"v": [a]}


def test_purge_expiry_and_stats_see_delayed_messages():
    h = Harness(queue(backoff_ms=[10_000], expiration_ms=5_000))
    a, b, c = h.pub("jobs", 3)
    h.sub("w", "jobs", 3)
    assert h.drain() == {"w": [a, b, c]}
    h.engine.cancel("w", [a, b, c], h.now)
    h.drain()
    stats = h.engine.stats()["queues"]["jobs"]
    assert (stats["depth"], stats["delayed"]) == (3, 3)
    assert [seq for seq, _ in h.engine.peek("jobs", 10)] == [a, b, c]
    q = h.engine.queues["jobs"]
    assert q.remove_available(b)
    assert h.engine.stats()["queues"]["jobs"]["delayed"] == 2
    h.advance(6_000)  # older than expiration: they expire while they wait
    h.drain()
    assert (q.depth, len(q.delays.due), len(q.sleeping)) == (0, 0, 0)
    assert sorted(s for e in h.events(R.EXPIRED) for s in e.bookmarks) == [a, c]


def test_bad_retry_settings_and_requests_are_refused():
    for bad in ([-1], [10**20], [1] * 33, ["1s"]):
        with pytest.raises(ConfigError, match="backoff"):
            QueueSettings(name="q", backoff_ms=bad).validate()
    for jitter in (-0.1, 1.5, math.nan, math.inf):
        with pytest.raises(ConfigError, match="backoff_jitter"):
            QueueSettings(name="q", backoff_jitter=jitter).validate()
    h = Harness(queue())
    [a] = h.pub("jobs")
    h.sub("w", "jobs")
    h.drain()
    for delay in (-2, 10**20):
        with pytest.raises(ProtocolError, match="delay"):
            h.engine.cancel("w", [a], h.now, delay)
    for nb in (-1, 10**20):
        with pytest.raises(ProtocolError, match="not-before"):
            h.engine.publish("jobs", b"x", {}, h.now, not_before_ms=nb)
    assert h.engine.queues["jobs"].lease_of  # still leased: nothing was applied


@pytest.mark.parametrize("group", [None, "g"])
def test_explain_says_delayed_for_a_message_waiting_for_its_retry_before_and_after_a_restart(group):
    from zq.core.explain import explain
    from zq.journal.base import recover_engine
    from zq.journal.memory_journal import MemoryJournal

    settings = QueueSettings(name="jobs", backoff_ms=[60_000], backoff_jitter=0.0)
    journal = MemoryJournal()
    h = Harness(settings)
    [a] = h.pub("jobs", group=group)
    h.sub("w", "jobs", 1)
    h.commit_to(journal)
    h.engine.settle("cancel", "w", [a], [1], h.now)
    h.engine.unsubscribe("w", h.now)
    h.commit_to(journal)
    headers = {"group": group} if group else {}
    before = explain(h.engine, "jobs", a, h.now, "jobs", headers)
    again = recover_engine(journal, [settings])
    after = explain(again, "jobs", a, h.now, "jobs", headers)
    assert before["place"] == after["place"] == "delayed", (before, after)
    assert before["due_in_ms"] == after["due_in_ms"] == 60_000
