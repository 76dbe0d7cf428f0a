"""Two-level fairness: weighted fair share between tenants, priority that ages."""

from collections import Counter

import msgspec
import pytest

from zq.core import QueueSettings
from zq.core import limits
from zq.core.errors import ConfigError
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness

FAIR = QueueSettings(name="jobs", tenant_header="tenant", group_header=None)


def tenants_of(h: Harness, seqs: list[int]) -> list[str]:
    return [h.journaled[s].headers.get("tenant", "") for s in seqs]


def take(h: Harness, n: int, sub: str = "w") -> list[int]:
    """Deliver and ack ``n`` messages one at a time (backlog 1): the dispatch order."""
    out: list[int] = []
    for _ in range(n):
        got = h.drain().get(sub, [])
        if not got:
            break
        out += got
        h.engine.ack(sub, got, h.now)
    return out


def test_a_tenant_that_published_first_does_not_hold_back_one_that_came_later():
    h = Harness(FAIR)
    big = h.pub("jobs", 100, tenant="big")
    small = h.pub("jobs", 3, tenant="small")
    h.sub("w", "jobs", backlog=1)
    order = take(h, 10)
    # small's three go within its share (every other message), not after big's hundred
    assert set(small) <= set(order)
    assert order[0] == big[0]
    assert tenants_of(h, order[:6]) == ["big", "small", "big", "small", "big", "small"]


def test_backlogged_tenants_are_served_in_proportion_to_their_weights():
    s = msgspec.structs.replace(FAIR, tenant_weights={"gold": 3, "bronze": 1})
    h = Harness(s)
    h.pub("jobs", 400, tenant="bronze")
    h.pub("jobs", 400, tenant="gold")
    h.sub("w", "jobs", backlog=1)
    counts = Counter(tenants_of(h, take(h, 200)))
    assert counts == {"gold": 150, "bronze": 50}


def test_the_default_weight_applies_to_tenants_not_named_and_to_messages_without_the_header():
    s = msgspec.structs.replace(FAIR, tenant_weights={"vip": 4}, tenant_default_weight=2)
    h = Harness(s)
    h.pub("jobs", 100, tenant="vip")
    h.pub("jobs", 100, tenant="other")
    h.pub("jobs", 100)  # no header: the tenant ""
    h.sub("w", "jobs", backlog=1)
    counts = Counter(tenants_of(h, take(h, 80)))
    assert counts == {"vip": 40, "other": 20, "": 20}


def test_an_idle_tenant_gets_no_credit_for_the_time_it_sent_nothing():
    h = Harness(FAIR)
    h.pub("jobs", 50, tenant="a")
    h.sub("w", "jobs", backlog=1)
    take(h, 30)  # a alone: the clock moves on
    late = h.pub("jobs", 20, tenant="b")
    order = take(h, 10)
    # b shares from now on (every other message), it does not get thirty in a row
    assert tenants_of(h, order) == ["a", "b"] * 5 or tenants_of(h, order) == ["b", "a"] * 5
    assert set(order) & set(late)


def test_inside_a_tenant_publish_order_holds_and_a_returned_message_goes_first_again():
    h = Harness(FAIR)
    a = h.pub("jobs", 5, tenant="a")
    h.sub("w", "jobs", backlog=1)
    first = h.drain()["w"]
    assert first == a[:1]
    h.engine.cancel("w", first, h.now)
    assert h.drain()["w"] == a[:1]  # its place is kept


def test_strict_priority_goes_first_across_tenants_and_tenants_share_within_a_priority():
    s = msgspec.structs.replace(FAIR, priority="prio")
    h = Harness(s)
    low = h.pub("jobs", 4, tenant="a", prio="1")
    high_a = h.pub("jobs", 3, tenant="a", prio="5")
    high_b = h.pub("jobs", 3, tenant="b", prio="5")
    h.sub("w", "jobs", backlog=1)
    order = take(h, 10)
    assert set(order[:6]) == set(high_a + high_b)
    assert tenants_of(h, order[:6]) == ["a", "b"] * 3
    assert order[6:] == low


def test_priority_aging_bounds_how_long_a_steady_stream_of_high_priority_delays_a_low_one():
    s = QueueSettings(name="jobs", priority="prio", priority_aging=10, group_header=None)
    h = Harness(s)
    h.sub("w", "jobs", backlog=1)
    low = h.pub("jobs", 1, prio="0")[0]
    order: list[int] = []
    for _ in range(60):  # one high-priority message per round, forever, a level 3 above
        h.pub("jobs", 1, prio="3")
        order += take(h, 1)
    assert low in order
    assert order.index(low) <= 3 * 10 + 1
    # without aging it would never go while the stream lasts
    strict = Harness(QueueSettings(name="jobs", priority="prio", group_header=None))
    strict.sub("w", "jobs", backlog=1)
    low = strict.pub("jobs", 1, prio="0")[0]
    seen: list[int] = []
    for _ in range(60):
        strict.pub("jobs", 1, prio="3")
        seen += take(strict, 1)
    assert low not in seen


def test_sequenced_groups_keep_their_order_inside_a_fair_queue():
    s = msgspec.structs.replace(FAIR, group_header="group")
    h = Harness(s)
    g = h.pub("jobs", 6, group="g1", tenant="a")
    other = h.pub("jobs", 6, tenant="b")
    h.sub("w", "jobs", backlog=1)
    order = take(h, 12)
    assert [x for x in order if x in g] == g
    assert sorted(order) == sorted(g + other)


def test_stats_show_what_each_tenant_holds_and_it_is_forgotten_when_it_holds_nothing():
    s = msgspec.structs.replace(FAIR, tenant_weights={"a": 2})
    h = Harness(s)
    h.pub("jobs", 3, tenant="a")
    h.pub("jobs", 1, tenant="b")
    h.drain()
    st = h.engine.stats()["queues"]["jobs"]
    assert st["tenants"] == [{"tenant": "a", "weight": 2, "held": 3}, {"tenant": "b", "weight": 1, "held": 1}]
    h.sub("w", "jobs", backlog=10)
    got = h.drain()["w"]
    assert h.engine.stats()["queues"]["jobs"]["tenants"][0]["held"] == 3  # leased still counts as held
    h.engine.ack("w", got, h.now)
    h.drain()
    q = h.engine.queues["jobs"]
    assert h.engine.stats()["queues"]["jobs"]["tenants"] == []
    assert q.fair_share is not None and not q.fair_share.tenant_of and not q.ranks


def test_many_tenants_do_not_grow_the_queue_state_without_bound():
    h = Harness(FAIR)
    h.sub("w", "jobs", backlog=1)
    for i in range(3 * limits.TENANTS_TRACKED_SOFT):
        h.pub("jobs", 1, tenant=f"t{i}")
        take(h, 1)
    fs = h.engine.queues["jobs"].fair_share
    assert fs is not None
    assert len(fs.finish) <= 2 * limits.TENANTS_TRACKED_SOFT
    assert not fs.held


def test_recovery_shares_the_remaining_backlog_out_fairly_again():
    journal = MemoryJournal()
    h = Harness(FAIR)
    h.pub("jobs", 50, tenant="a")
    b = h.pub("jobs", 5, tenant="b")
    h.commit_to(journal)
    eng = recover_engine(journal, [FAIR])
    eng.subscribe("w", "jobs", "w", 1, 0)
    order: list[int] = []
    for _ in range(10):
        out = eng.drain(0)
        seqs = [s for d in out.deliveries for s in d.seqs]
        order += seqs
        eng.ack("w", seqs, 0)
    assert set(b) <= set(order)


@pytest.mark.parametrize("changes, words", [
    ({"tenant_weights": {"a": 0}}, "weight is a whole number"),
    ({"tenant_weights": {"a": limits.TENANT_WEIGHT_MAX + 1}}, "weight is a whole number"),
    ({"tenant_weights": {"a": True}}, "weight is a whole number"),
    ({"tenant_weights": {"a": 2.5}}, "weight is a whole number"),
    ({"tenant_weights": {"a": 2**64}}, "weight is a whole number"),
    ({"tenant_default_weight": -1}, "weight is a whole number"),
    ({"tenant_weights": {"x" * (limits.HEADER_BYTES_MAX + 1): 2}}, "a tenant's name"),
    ({"tenant_weights": {f"t{i}": 1 for i in range(limits.TENANT_WEIGHTS_MAX + 1)}}, "at most"),
    ({"tenant_header": ""}, "tenant_header must be"),
    ({"tenant_header": "h" * (limits.HEADER_BYTES_MAX + 1)}, "tenant_header must be"),
    ({"tenant_header": None, "tenant_weights": {"a": 2}}, "need tenant_header"),
    ({"priority_aging": 5}, "set priority too"),
    ({"priority": "prio", "priority_aging": -1}, "priority_aging must be"),
    ({"priority": "prio", "priority_aging": limits.PRIORITY_AGING_MAX + 1}, "priority_aging must be"),
    ({"sort_key": "k"}, "cannot be combined with sort_key"),
    ({"barrier": "x = 1"}, "cannot be combined with barrier"),
    ({"browse_only": True}, "browse_only"),
    ({"max_depth": 5, "overflow": "ring"}, "overflow = 'ring'"),
    ({"target_queue_depth": 5}, "target_queue_depth cannot be combined with tenant_header"),
])
def test_bad_fairness_settings_are_refused_naming_the_key(changes, words):
    with pytest.raises(ConfigError, match=words):
        msgspec.structs.replace(FAIR, **changes).validate()


def test_a_hostile_tenant_header_value_is_just_a_tenant():
    h = Harness(FAIR)
    h.sub("w", "jobs", backlog=4)
    h.pub("jobs", 1, tenant="x" * limits.HEADER_BYTES_MAX)
    h.pub("jobs", 1, tenant="")
    h.pub("jobs", 1, tenant="\x00\udcff")
    assert len(h.drain()["w"]) == 3


def test_explain_names_the_tenant_its_weight_and_what_goes_before_it_by_the_share():
    from zq.core.explain import explain

    s = msgspec.structs.replace(FAIR, tenant_weights={"big": 2})
    h = Harness(s)
    big = h.pub("jobs", 6, tenant="big")
    small = h.pub("jobs", 2, tenant="small")
    h.drain()
    m = h.journaled[small[1]]
    doc = explain(h.engine, "jobs", small[1], h.now, m.topic, m.headers)
    assert doc["state"] == "waiting"
    assert doc["tenant"] == {"name": "small", "weight": 1, "held": 2}
    # small's second starts at 1.0: big's at 0, 0.5, 1.0 (older, so first on the tie) and small's first go before
    assert any(w.startswith("4 messages go before it by the fair share") and "weight 1" in w for w in doc["why"]), doc
    first = explain(h.engine, "jobs", big[0], h.now, h.journaled[big[0]].topic, h.journaled[big[0]].headers)
    assert not any("fair share" in w for w in first["why"])


def fair_share_lag(seed: int, steps: int = 300) -> float:
    """A random workload served one message at a time; over every stretch in which two
    tenants both have messages waiting, how far their services, each divided by its
    weight, drift apart, in units of the bound start-time fair queuing guarantees
    (``1 / w_t + 1 / w_u``, Goyal, Vin and Cheng). The largest such ratio seen."""
    import random

    rng = random.Random(seed)
    names = ["a", "b", "c", "d"][: rng.randint(2, 4)]
    weights = {t: rng.randint(1, 5) for t in names}
    h = Harness(msgspec.structs.replace(FAIR, tenant_weights=weights))
    h.sub("w", "jobs", backlog=1)
    waiting: dict[str, int] = {t: 0 for t in names}
    served = {(t, u): [0, 0] for t in names for u in names if t < u}  # since both began to wait
    worst = 0.0
    for _ in range(steps):
        if rng.random() < 0.5:
            t = rng.choice(names)
            n = rng.choice([1, 1, 3, 10])
            h.pub("jobs", n, tenant=t)
            waiting[t] += n
        before = {t for t in names if waiting[t]}
        got = take(h, 1)
        if not got:
            continue
        who = h.journaled[got[0]].headers["tenant"]
        waiting[who] -= 1
        for (t, u), counts in served.items():
            if t in before and u in before:
                counts[0] += who == t
                counts[1] += who == u
                lag = abs(counts[0] / weights[t] - counts[1] / weights[u])
                worst = max(worst, lag / (1 / weights[t] + 1 / weights[u]))
            if not (waiting[t] and waiting[u]):
                counts[0] = counts[1] = 0  # the stretch ends
    return worst


def test_backlogged_tenants_never_drift_apart_more_than_start_time_fair_queuing_allows():
    worst = max(fair_share_lag(seed) for seed in range(40))
    assert 0.5 <= worst <= 1.0 + 1e-6, worst  # reached (the check bites) and never passed


@pytest.mark.interpreted_core
@pytest.mark.parametrize("bug", ["weights-ignored", "tenants-ignored"])
def test_the_drift_check_catches_a_share_that_ignores_weights_or_tenants(bug, monkeypatch):
    from zq.core.fairshare import FairShare

    if bug == "weights-ignored":
        monkeypatch.setattr(FairShare, "weight", lambda self, tenant: 1)
    else:
        monkeypatch.setattr(FairShare, "tenant", lambda self, headers: "")
    assert max(fair_share_lag(seed) for seed in range(40)) > 1.0
