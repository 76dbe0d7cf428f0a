"""Delivery accounting by cause: cancelled, failed, lease expired, consumer gone."""

import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.errors import ConfigError, ProtocolError
from zq.core.explain import explain
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness


def queue(**kw) -> QueueSettings:
    kw.setdefault("lease_ms", 100)
    return QueueSettings(name="jobs", dead_letter="jobs.dead", max_deliveries=0, **kw)


def counts(h: Harness, seq: int) -> tuple[int, int, int, int]:
    c = h.engine.queues["jobs"].causes_of(seq)
    return (c.cancelled, c.failed, c.lease_expired, c.consumer_gone) if c else (0, 0, 0, 0)


def test_each_unfinished_delivery_is_counted_by_its_cause():
    h = Harness(queue())
    [a] = h.pub("jobs")
    h.engine.subscribe("w", "jobs", "w", 1, h.now, consumer_name="host:7 worker-1")
    h.drain()
    h.engine.cancel("w", [a], h.now)
    h.drain()
    h.advance(10)
    h.engine.cancel("w", [a], h.now, error="ValueError('bad row')")
    h.drain()
    h.advance(100)  # lease expired
    h.drain()
    h.engine.disconnect("w", h.now)
    assert counts(h, a) == (1, 1, 1, 1)
    doc = explain(h.engine, "jobs", a, h.now, "jobs", {})
    assert doc["causes"]["last_error"] == "ValueError('bad row')"
    assert doc["causes"]["last_consumer"] == "host:7 worker-1"
    assert (doc["causes"]["first_ms"], doc["causes"]["last_ms"]) == (0, 110)
    stats = h.engine.stats()["queues"]["jobs"]
    assert (stats["failed"], stats["lease_expiries"], stats["consumers_gone"]) == (1, 1, 1)
    failed = [e for e in h.events(R.CANCELLED) if e.reason]
    assert [(e.bookmarks, e.reason) for e in failed] == [([a], "ValueError('bad row')")]


@pytest.mark.parametrize(("limit", "end", "reason"), [
    ("max_failures", "fail", R.REASON_MAX_FAILURES),
    ("max_lease_expiries", "expire", R.REASON_MAX_LEASE_EXPIRIES),
    ("max_consumer_gone", "leave", R.REASON_MAX_CONSUMER_GONE),
])
def test_each_cause_has_its_own_limit_and_the_dead_letter_carries_the_account(limit, end, reason):
    h = Harness(queue(**{limit: 2}))
    [a] = h.pub("jobs")
    h.sub("w0", "jobs", 1)
    assert h.drain() == {"w0": [a]}
    h.engine.cancel("w0", [a], h.now)  # a plain cancel counts toward none of these limits
    assert h.drain() == {"w0": [a]}
    holder = "w0"
    for i in range(1, 3):
        if end == "fail":
            h.engine.cancel(holder, [a], h.now, error=f"attempt {i}")
        elif end == "expire":
            h.advance(100)
        else:
            h.engine.disconnect(holder, h.now)
            holder = f"w{i}"
            h.sub(holder, "jobs", 1)
        got = h.drain()
        assert got == ({holder: [a]} if i == 1 else {}), (i, got)
    assert [(e.bookmarks, e.reason) for e in h.events(R.EXPIRED)] == [([a], reason)]
    [dead] = [r for r in h.records if isinstance(r, R.Message) and r.topic == "jobs.dead"]
    c = {k.removeprefix("zq."): v for k, v in dead.headers.items()}
    assert c["reason"] == reason and c["cancelled"] == "1"
    assert c[{"fail": "failed", "expire": "lease_expired", "leave": "consumer_gone"}[end]] == "2"
    if end == "fail":
        assert c["error"] == "attempt 2"


def test_a_crash_while_leased_counts_the_consumer_gone_once_however_often_it_restarts():
    settings = queue(lease_ms=10**6)
    j = MemoryJournal()
    h = Harness(settings)
    [a] = h.pub("jobs")
    h.engine.subscribe("w", "jobs", "w", 1, h.now, consumer_name="worker-1")
    h.engine.cancel("w", [a], h.now) if h.commit_to(j) == {"w": [a]} else None
    h.commit_to(j)  # delivered again (the second delivery), then the dispatcher dies holding it
    for _ in range(3):
        h2 = Harness(settings)
        h2.engine = recover_engine(j, [settings])
        h2.commit_to(j)
        assert counts(h2, a) == (1, 0, 0, 1)
        assert h2.engine.queues["jobs"].causes_of(a).last_consumer == "worker-1"


def test_a_crash_that_reaches_max_consumer_gone_dead_letters_on_recovery():
    settings = queue(lease_ms=10**6, max_consumer_gone=1)
    j = MemoryJournal()
    h = Harness(settings)
    [a] = h.pub("jobs")
    h.sub("w", "jobs", 1)
    h.commit_to(j)
    engine = recover_engine(j, [settings])
    out = engine.drain(0)
    expired = [(e.bookmarks, e.reason) for e in out.records if isinstance(e, R.Event) and e.kind == R.EXPIRED]
    assert expired == [([a], R.REASON_MAX_CONSUMER_GONE)]
    [dead] = [r for r in out.records if isinstance(r, R.Message)]
    assert (dead.topic, dead.headers["zq.consumer_gone"]) == ("jobs.dead", "1")


def test_bad_errors_and_limits_are_refused():
    h = Harness(queue())
    [a] = h.pub("jobs")
    h.sub("w", "jobs", 1)
    h.drain()
    with pytest.raises(ProtocolError, match="1024"):
        h.engine.cancel("w", [a], h.now, error="x" * 1025)
    assert counts(h, a) == (0, 0, 0, 0) and a in h.engine.queues["jobs"].lease_of
    for key in ("max_failures", "max_lease_expiries", "max_consumer_gone"):
        for bad in (-1, 65536):
            with pytest.raises(ConfigError, match=key):
                QueueSettings(name="q", **{key: bad}).validate()
