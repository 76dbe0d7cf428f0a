"""Operator actions in the engine: replace, ack by filter, purge, move, redrive,
groups, run-time queues; each journaled so recovery agrees."""

import pytest

from zq.core import Engine, QueueSettings
from zq.core import records as R
from zq.core.errors import ConfigError, ProtocolError, QueueExistsError
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness


def test_replace_changes_filter_and_backlog_without_breaking_leases():
    h = Harness()
    red = h.pub("jobs", 2, color="red")
    blue = h.pub("jobs", 2, color="blue")
    h.sub("s", "jobs", backlog=1, filter="color = 'red'")
    assert h.drain() == {"s": red[:1]}
    assert h.engine.replace("s", "jobs", 10, "color = 'blue'", h.now) == 10
    assert h.drain() == {"s": blue}  # the lease on red[0] is untouched
    assert h.engine.ack("s", red[:1], h.now) == []
    h.engine.replace("s", "jobs", 10, None, h.now)
    assert h.drain() == {"s": red[1:]}


def test_replace_moves_to_another_queue_only_when_holding_nothing():
    h = Harness()
    a = h.pub("a")
    b = h.pub("b")
    h.sub("s", "a")
    assert h.drain() == {"s": a}
    with pytest.raises(ProtocolError, match="holding 1"):
        h.engine.replace("s", "b", 1, None, h.now)
    h.engine.ack("s", a, h.now)
    h.engine.replace("s", "b", 1, None, h.now)
    assert h.drain() == {"s": b}


def test_ack_by_filter_takes_available_messages_and_leased_ones_only_when_shared():
    h = Harness(QueueSettings(name="strict"), QueueSettings(name="shared", leasing="shared"))
    for q in ("strict", "shared"):
        h.pub(q, 3, kind="stale")
        h.sub(f"w-{q}", q)
    got = h.drain()
    assert h.engine.ack_filter("strict", "kind = 'stale'", "admin", h.now) == 2
    assert h.engine.ack_filter("shared", "kind = 'stale'", "admin", h.now) == 3
    assert h.engine.ack("w-shared", got["w-shared"], h.now) == got["w-shared"]  # the holder's ack is refused now
    assert h.engine.queues["strict"].depth == 0 and len(h.engine.queues["strict"].lease_of) == 1


def test_purge_all_a_group_or_a_filter_leaves_leased_messages_alone():
    h = Harness()
    g1 = h.pub("jobs", 2, group="g1")
    g2 = h.pub("jobs", 2, group="g2", size="big")
    h.sub("w", "jobs")
    assert h.drain() == {"w": g1[:1]}
    assert h.engine.purge("jobs", h.now, group="g1") == 1
    assert h.engine.purge("jobs", h.now, filter="size = 'big'") == 2
    h.drain()
    assert sorted(b for e in h.events(R.EXPIRED) if e.reason == "purged" for b in e.bookmarks) == g1[1:] + g2
    assert h.engine.peek("jobs", 10) == [] and list(h.engine.queues["jobs"].lease_of) == g1[:1]


def test_move_republishes_elsewhere_and_redrive_returns_dead_letters_with_their_id():
    journal = MemoryJournal()
    from zq.core.engine import Engine

    e = Engine([QueueSettings(name="jobs", max_cancels=1, dead_letter="jobs.dead")],
               content=journal.get_message, find_id=journal.find_id)

    def step():
        journal.append(e.drain(0).records)
        journal.commit(0)

    seq = e.publish("jobs", b"payload", {"k": "v"}, 0, msg_id="id-1")
    e.subscribe("w", "jobs", "w", 1, 0)
    step()
    e.cancel("w", [seq], 0)
    step()
    e.unsubscribe("w", 0)
    assert e.queues["jobs.dead"].depth == 1
    assert e.redrive("jobs.dead", 0) == 1
    step()
    back = [s for s, _ in e.peek("jobs", 10)]
    assert len(back) == 1 and back[0] != seq
    m = journal.get_message(back[0])
    assert (m.topic, m.payload, m.headers, m.msg_id) == ("jobs", b"payload", {"k": "v"}, "id-1")
    assert e.move("jobs", "elsewhere", 0) == 1
    step()
    moved = [s for s, _ in e.peek("elsewhere", 10)]
    assert journal.get_message(moved[0]).headers["zq.reason"] == "moved"
    again = recover_engine(journal, [QueueSettings(name="jobs", max_cancels=1, dead_letter="jobs.dead")])
    assert again.peek("jobs", 10) == [] and [s for s, _ in again.peek("elsewhere", 10)] == moved


def test_groups_list_pending_and_in_flight_and_the_holder_for_every_policy():
    for policy in ("sequenced", "exclusive", "one-in-flight"):
        h = Harness(QueueSettings(name="jobs", group_policy=policy))
        h.pub("jobs", 3, group="a")
        h.pub("jobs", 1, group="b")
        h.sub("w", "jobs", backlog=2)
        h.drain()
        holder = None if policy == "one-in-flight" else "w"
        a_out = 1 if policy == "one-in-flight" else 2
        assert h.engine.group_list("jobs") == [
            {"group": "a", "pending": 3 - a_out, "in_flight": a_out, "owner": holder},
            {"group": "b", "pending": 1, "in_flight": 0, "owner": None},
        ] if policy != "one-in-flight" else [
            {"group": "a", "pending": 2, "in_flight": 1, "owner": None},
            {"group": "b", "pending": 0, "in_flight": 1, "owner": None},
        ], policy


def test_run_time_queues_survive_restart_config_wins_and_delete_is_journaled():
    journal = MemoryJournal()
    config = [QueueSettings(name="fixed")]
    e = recover_engine(journal, config)
    configured = {"fixed"}.__contains__
    e.declare_queue(QueueSettings(name="rt", topics="rt.*", lease_ms=5000), configured)
    assert e.declare_queue(QueueSettings(name="fixed"), configured) is False  # as configured: nothing to do
    with pytest.raises(QueueExistsError, match=r"exists \(in the config file, which wins\).*lease_ms: 30000 -> 1000"):
        e.declare_queue(QueueSettings(name="fixed", lease_ms=1000), configured)
    with pytest.raises(QueueExistsError, match=r"topics: 'rt\.\*' -> None; lease_ms: 5000 -> 30000"):
        e.declare_queue(QueueSettings(name="rt"), configured)
    assert e.declare_queue(QueueSettings(name="rt", topics="rt.*", lease_ms=5000), configured) is False
    with pytest.raises(ConfigError, match="config file"):
        e.declare_queue(QueueSettings(name="fixed2"), {"fixed2"}.__contains__)
    e.publish("rt.a", b"x", {}, 0)
    journal.append(e.drain(0).records)
    journal.commit(0)
    again = recover_engine(journal, config)
    assert again.queues["rt"].settings.lease_ms == 5000 and again.queues["rt"].depth == 1
    with pytest.raises(ConfigError):
        again.delete_queue("fixed", configured, 0)
    assert again.delete_queue("rt", configured, 0) == 1
    journal.append(again.drain(0).records)
    journal.commit(0)
    assert "rt" not in recover_engine(journal, config, auto_queues=False).queues


def test_a_run_time_queue_shadowed_by_the_config_is_reported_and_the_config_wins(caplog):
    journal = MemoryJournal()
    e = recover_engine(journal, [])
    e.declare_queue(QueueSettings(name="jobs", lease_ms=1000), lambda name: False)
    journal.append(e.drain(0).records)
    journal.commit(0)
    with caplog.at_level("WARNING", logger="zq.journal"):
        again = recover_engine(journal, [QueueSettings(name="jobs", lease_ms=9000)])
    assert again.queues["jobs"].settings.lease_ms == 9000
    assert "config wins" in caplog.text


# ------------------------------------------------- a queue's name is reserved (issue 31 §3)


def test_a_publish_to_a_queue_name_its_topics_do_not_take_is_refused_before_it_is_journaled():
    from zq.core.errors import ReservedNameError

    h = Harness(QueueSettings(name="orders", topics=r"^orders\..*", dead_letter="orders.dead"))
    first = h.pub("orders.eu")
    h.drain()
    records = len(h.records)
    with pytest.raises(ReservedNameError, match=r"'orders' is the name of queue 'orders'.*publish to one of its topics"):
        h.pub("orders")
    assert h.engine.queues["orders"].settings.topics == r"^orders\..*"  # never replaced by an auto-created queue
    assert [s for s, _ in h.engine.peek("orders", 10)] == first
    h.drain()
    assert len(h.records) == records  # nothing journaled
    h.sub("w", "orders")  # a subscription by name reaches the configured queue
    assert h.drain() == {"w": first}


def test_a_queue_is_never_replaced_and_dead_letters_cannot_target_a_queue_that_refuses_them():
    with pytest.raises(ConfigError, match="dead_letter 'held' is the name of queue 'held'.*reach no queue"):
        Engine([QueueSettings(name="jobs", dead_letter="held"), QueueSettings(name="held", topics="^parked$")])
    Engine([QueueSettings(name="jobs", dead_letter="held"), QueueSettings(name="held", topics="^(parked|held)$")])
    h = Harness(QueueSettings(name="jobs", dead_letter="jobs.failed"))
    with pytest.raises(ProtocolError, match="already exists"):
        h.engine.add_queue(QueueSettings(name="jobs"))
    with pytest.raises(ConfigError, match="dead_letter 'jobs.failed'"):  # a run-time queue taking the target's name
        h.engine.declare_queue(QueueSettings(name="jobs.failed", topics="^other$"), lambda name: False)
    h.engine.declare_queue(QueueSettings(name="parking", topics="^p$"), lambda name: False)
    with pytest.raises(ConfigError, match="queue 'x': dead_letter 'parking'"):
        h.engine.declare_queue(QueueSettings(name="x", dead_letter="parking", topics="^x$"), lambda name: False)
    with pytest.raises(ConfigError, match=r"comes back to it \(x -> x\)"):  # x would take its own dead letters
        h.engine.declare_queue(QueueSettings(name="x", dead_letter="parking", topics="^(x|parking)$"), lambda name: False)
    h.engine.declare_queue(QueueSettings(name="catch", topics="^parking$"), lambda name: False)
    h.engine.declare_queue(QueueSettings(name="x", dead_letter="parking", topics="^x$"), lambda name: False)
    h.engine.declare_queue(QueueSettings(name="jobs.failed", topics="^jobs[.]failed$"), lambda name: False)


def test_a_copy_to_a_reserved_name_stays_in_the_journal_and_says_so():
    """A redrive's copy goes back to its original topic; should that topic meanwhile be the
    name of a queue that does not take it, the copy is journaled there (never lost from the
    journal), in no queue, and a notice says so; nothing raises mid-slice."""
    h = Harness(QueueSettings(name="jobs", dead_letter="jobs.dead"))
    seq = h.pub("jobs")[0]
    h.drain()
    h.engine.purge("jobs", h.now)
    h.engine.queues.pop("jobs")
    h.engine.route_cache.clear()
    h.engine.add_queue(QueueSettings(name="jobs", topics="^jobs2$"))
    copy = h.engine.publish_copy("jobs", seq, {})
    assert h.engine.route("jobs") == [] and any("in no queue" in n for n in h.engine.notices)
    assert any(type(r) is R.Message and r.seq == copy for r in h.engine.drain(h.now).records)


def test_every_copy_is_journaled_before_the_event_that_takes_its_original_out():
    """A standby holds a prefix of its leader's journal when the leader dies: any prefix
    with the expiry (or move) of a message must hold its dead letter (or moved copy), or
    a confirmed message leaves every queue. Expiries, poison, moves and redrives alike."""
    h = Harness(QueueSettings(name="jobs", max_deliveries=1, dead_letter="jobs.dead", priority="/p"),
                QueueSettings(name="other"))
    a, b, c = h.pub("jobs", 3, payload=b'{"p": 1}')
    h.pub("jobs", payload=b'{"p": "\xff"}')  # poison
    h.sub("w", "jobs", backlog=1)
    h.drain()
    h.engine.cancel("w", [a], h.now)  # its one delivery used: expires, dead-lettered
    h.drain()
    assert h.engine.move("jobs", "other", h.now) == 1  # b is out with w
    h.drain()
    copies = {}
    for r in h.records:
        if type(r) is R.Message and r.copy_of is not None:
            copies.setdefault(r.copy_of, []).append(r.seq)
    checked = 0
    for r in h.records:
        if type(r) is R.Event and r.kind == R.EXPIRED:
            for seq in r.bookmarks:
                for copy in copies.get(seq, []):
                    assert copy < r.seq, f"copy {copy} of {seq} journaled after the event {r.seq} taking it out"
                    checked += 1
    assert checked == 3, checked  # a dead letter, a poison's, a move's
