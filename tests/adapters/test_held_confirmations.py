"""Confirmations the dispatcher holds back (replicas_ack with no standby; a flow-control
queue over its limit) cost the loop only what it releases, go with a publisher that
leaves, and are capped per connection: the next publish is refused, nothing stored
(issue #32 §3). Real sockets, an embedded dispatcher, raw frames as a hostile peer."""

from __future__ import annotations

import secrets

import zmq

import zq
from zq import wire
from zq.core.settings import QueueSettings
from zq.server.config import Config
from zq.server.held import CONFIRMATIONS_HELD_PER_PEER_MAX, HeldConfirmations

from .support import frames_for, raw_session, wait_until


def publish_frames(sock: zmq.Socket, topic: str, n: int, first_req: int = 1) -> None:
    for i in range(n):
        sock.send(wire.encode(wire.Publish(first_req + i, topic, [(b"x%d" % i, {}, None)])), copy=False)


def test_a_publisher_that_leaves_takes_its_held_confirmations_and_one_publisher_holds_at_most_its_cap(tmp_path):
    cfg = Config.from_dict({"cluster": {"replicas_ack": 1, "standby_secret": secrets.token_hex(16)}})
    cfg.data, cfg.bind = str(tmp_path / "d"), ["tcp://127.0.0.1:0"]
    d = zq.Dispatcher(cfg).start()
    try:
        with zq.connect(d.inproc) as watcher:
            held = lambda: watcher.stats()["server"]["replication"]["held_confirmations"]  # noqa: E731
            sock = raw_session(d.endpoint, "hoarder")
            extra = 7
            publish_frames(sock, "jobs", CONFIRMATIONS_HELD_PER_PEER_MAX + extra)
            answers = frames_for(sock, 0.5)
            while len(answers) < extra and sock.poll(10_000):
                answers.append(wire.server_decoder.decode(sock.recv()))
            refused = [a for a in answers if type(a) is wire.Error]
            assert len(refused) == extra and all(a.code == "limit" for a in refused), answers[:3]
            assert "nothing stored" in refused[0].message
            assert not [a for a in answers if type(a) is wire.Confirm]  # (no standby: none released)
            assert held() == CONFIRMATIONS_HELD_PER_PEER_MAX
            assert watcher.stats()["queues"]["jobs"]["depth"] == CONFIRMATIONS_HELD_PER_PEER_MAX  # the refused: not stored
            other = raw_session(d.endpoint, "bystander")  # the cap is per connection: another still publishes
            publish_frames(other, "jobs", 1)
            wait_until(lambda: held() == CONFIRMATIONS_HELD_PER_PEER_MAX + 1, what="the bystander's held")
            sock.send(wire.encode(wire.Bye()))
            wait_until(lambda: held() == 1, what="the hoarder's held confirmations dropped with its session")
            sock.close(0)
            other.close(0)
    finally:
        d.stop()


def test_flow_held_confirmations_go_with_their_publisher(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"],
                             queues=[QueueSettings(name="jobs", max_depth=5, overflow="flow-control")])).start()
    try:
        with zq.connect(d.inproc) as watcher:
            flow_held = lambda: watcher.stats()["server"]["replication"]["flow_held_confirmations"]  # noqa: E731
            sock = raw_session(d.endpoint, "flooder")
            publish_frames(sock, "jobs", 50)
            wait_until(lambda: flow_held() == 45, what="45 confirmations held on the full queue")
            sock.send(wire.encode(wire.Bye()))
            wait_until(lambda: flow_held() == 0, what="held confirmations dropped with the session")
            sock.close(0)
            watcher.purge("jobs")  # the queue drains: nothing left to send, nothing sent to nobody
            assert flow_held() == 0
    finally:
        d.stop()


def test_releases_look_only_at_what_they_release():
    """The structure, directly: a release sends what is due in order and counts per peer."""
    h = HeldConfirmations()
    sent: list[tuple[bytes, bytes]] = []
    for i in range(1000):
        h.hold_replicated(b"p%d" % (i % 3), b"c%d" % i, needs=i + 1)
    h.release_replicated(10, lambda p, f: sent.append((p, f)))
    assert [f for _, f in sent] == [b"c%d" % i for i in range(10)]
    assert len(h) == 990 and len(h.replicated) == 990
    h.drop_peer(b"p0")
    assert len(h) == 990 - sum(1 for i in range(10, 1000) if i % 3 == 0)
    blocked = {"a", "b"}
    h.hold_flow(b"q", b"f1", ["a", "b"])
    h.hold_flow(b"q", b"f2", ["b"])
    out: list[bytes] = []
    blocked.discard("a")
    h.release_flow(lambda n: n in blocked, lambda p, f: out.append(f))
    assert out == [] and list(h.flow) == ["b"] and h.flow_count == 2  # f1 waits on b now
    blocked.clear()
    h.release_flow(lambda n: n in blocked, lambda p, f: out.append(f))
    assert sorted(out) == [b"f1", b"f2"] and h.flow_count == 0 and not h.flow


def test_one_peer_holds_at_most_a_few_waiting_bounds_and_they_go_with_it(tmp_path):
    """Waiting BOUNDS (a standby's long poll on the journal) were capped only in all
    (server.max_connections): one peer could take every slot, and a real standby got
    `limit`. Now at most 4 per connection; a peer's go when it leaves; a publish answers
    the waiting ones at once (as does a recovery point, every second: a table change)."""
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"])).start()
    try:
        with zq.connect(d.inproc) as c:
            c.publish("jobs", b"first")  # (the queue exists: a later publish changes no table)
        hog = raw_session(d.endpoint, "hog")
        for req in range(1, 6):
            hog.send(wire.encode(wire.Bounds(req, None, after=10**6, wait_ms=60_000)))
        answers = [a for a in frames_for(hog, 0.5) if type(a) is not wire.Heartbeat]
        assert [(a.req, a.code) for a in answers if type(a) is wire.Error] == [(5, "limit")], answers
        standby = raw_session(d.endpoint, "standby")
        standby.send(wire.encode(wire.Bounds(7, None, after=2, wait_ms=60_000)))
        assert [a for a in frames_for(standby, 0.3) if type(a) is not wire.Heartbeat] == []  # waiting, not refused
        with zq.connect(d.inproc) as c:
            c.publish("jobs", b"x")
        got = [a for a in frames_for(standby, 1.0) if type(a) is not wire.Heartbeat]
        assert [type(a) for a in got] == [wire.Reply] and got[0].req == 7
        server = d.server
        assert server is not None and len(server.bounds_waiting) <= 4  # the hog's (or fewer: a recovery point answers them)
        hog.send(wire.encode(wire.Bye()))
        wait_until(lambda: not server.bounds_waiting, what="the hog's waiting bounds gone with it")
        hog.close(0)
        standby.close(0)
    finally:
        d.stop()


def test_stats_lists_at_most_a_thousand_sessions_and_counts_them_all(tmp_path):
    """Ten thousand sessions once made every STATS answer list them all (megabytes,
    the loop held for seconds, for every caller)."""
    from zq.server.stats import STATS_PEERS_MAX

    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=[f"ipc://{tmp_path}/zq.sock"])).start()
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, STATS_PEERS_MAX + 64)
    socks = []
    try:
        for i in range(STATS_PEERS_MAX + 5):
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.connect(d.endpoint)
            s.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, f"idle{i}")))
            socks.append(s)
        with zq.connect(d.inproc) as c:
            wait_until(lambda: c.stats()["server"]["peers"] > STATS_PEERS_MAX + 5, what="every session open")
            st = c.stats()
            assert len(st["peers"]) == STATS_PEERS_MAX == st["server"]["peers_listed"]
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
        d.stop()
