"""Expired work moves on, over real sockets: a stuck worker's message goes to the idle
one, and the stuck worker's late ack says what became of it (issue: operators)."""

from __future__ import annotations

import pytest

import zq
from zq.core.settings import QueueSettings
from zq.server.config import Config


@pytest.fixture
def dispatcher(tmp_path):
    queues = [QueueSettings(name="slow", lease_ms=400, max_deliveries=3, dead_letter="slow.dead"),
              QueueSettings(name="once", lease_ms=300, max_deliveries=1, dead_letter="once.dead")]
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], queues=queues)).start()
    yield d
    d.stop()


def test_a_stuck_workers_expired_message_goes_to_the_idle_worker(dispatcher):
    with zq.Publisher(dispatcher.endpoint) as p, \
            zq.Worker(dispatcher.endpoint, "slow", max_backlog=1) as a, \
            zq.Worker(dispatcher.endpoint, "slow", max_backlog=1) as b:
        # Both are subscribed before the publish (a get() subscribes; the first to ask may win).
        assert a.get(timeout=0.05) is None and b.get(timeout=0.05) is None
        p.publish("slow", b"resize image 7")
        first = a.get(timeout=5) or None
        stuck, idle = (a, b) if first is not None else (b, a)
        msg = first or b.get(timeout=5)
        assert msg is not None and msg.deliveries == 1
        again = idle.get(timeout=10)  # after the 400 ms lease: to the idle one, not back to the stuck one
        assert again is not None and again.bookmark == msg.bookmark and again.deliveries == 2
        assert msg.ack(wait=True) == "lost"  # the stuck one's late ack: someone else has it
        assert stuck.lost == 1 and stuck.refused == 1  # a waited-for verdict is counted like a batched one
        assert again.ack(wait=True) == "ok"


def test_a_late_ack_of_a_dead_lettered_message_says_dead(dispatcher):
    with zq.Publisher(dispatcher.endpoint) as p, zq.Worker(dispatcher.endpoint, "once", max_backlog=1) as w:
        p.publish("once", b"charge card 9")
        msg = w.get(timeout=5)
        assert msg is not None
        with zq.connect(dispatcher.endpoint) as c:
            with c.subscribe("once.dead") as dead:
                letter = dead.get(10)  # its only delivery's lease ended: dead-lettered
                assert letter is not None and letter.data == b"charge card 9"
                letter.ack()
        assert msg.ack(wait=True) == "dead"  # (was "done": as if the work had been recorded)
        assert w.refused == 1 and w.lost == 0


def test_a_subscription_counts_waited_verdicts_too(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        c.publish("once", b"x")
        with c.subscribe("once", max_backlog=1) as sub:
            msg = sub.get(5)
            with c.subscribe("once.dead") as dead:
                assert dead.get(10) is not None
            assert msg.ack(wait=True) == "dead"
            assert sub.refused == 1 and sub.lost == 0
