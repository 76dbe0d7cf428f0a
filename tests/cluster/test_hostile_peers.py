"""Peers that lie (issue #32 §2): only real standbys count, only ZooKeeper deposes a
leader, and a standby's answering thread survives any frame. Real processes, a real
ZooKeeper; the liars are raw DEALER sockets speaking ZQP/1 frame by frame.

* A client sending BOUNDS with a standby's node name and a huge position is not taken
  as that standby: with the real standbys frozen, a held confirmation stays held, and
  goes once they come back and copy it.
* A made-up node name never joins the in-sync set in ZooKeeper.
* BOUNDS naming ``epoch = 2**62`` does not depose the leader: ZooKeeper says the epoch
  did not move, so its epoch and its clients' sessions stay.
* Malformed frames (invalid UTF-8, broken msgpack, wrong types, huge, multipart) at a
  standby's endpoint: a client after them still gets its ``not-leader`` answer.
* A lone leader with ``replicas_ack`` (no cluster): counted only with a proof, the
  ``[cluster] standby_secret`` (or ``[security]``); without either it refuses to start.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import zmq

import zq
from zq import wire

from tests.adapters.support import ServerProcess, env, frames_for, raw_session, wait_until

QUEUE = '[[queue]]\nname = "jobs"\nlease = "30s"\n'


def answer_to(sock: zmq.Socket, frame: bytes, seconds: float = 10.0) -> object:
    """Send ``frame``; the first REPLY or ERROR that comes (None: none in time)."""
    sock.send(frame)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1):
            msg = wire.server_decoder.decode(sock.recv())
            if type(msg) in (wire.Reply, wire.Error):
                return msg
    return None


def bounds(req: int, position: int, node: str = "", epoch: int = 0, proof: str = "") -> bytes:
    """A standby's BOUNDS (built by hand: what any client can send)."""
    return msgspec.msgpack.encode(["bounds", req, None, -1, 0, position, node, epoch, proof])


def lie(fakes: dict[str, zmq.Socket], epoch: int, seconds: float, watch: zmq.Socket | None = None) -> list[object]:
    """Each fake standby claims, ten times a second for ``seconds``, to be the node it is
    keyed by and to hold far more than the leader ever wrote; what ``watch`` heard meanwhile."""
    heard: list[object] = []
    req = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name, sock in fakes.items():
            req += 1
            sock.send(bounds(req, 2**62, name, epoch, "not-the-proof"))
            while sock.poll(0):
                sock.recv()  # (their answers: not what is tested)
        if watch is not None:
            heard += frames_for(watch, 0.1)
        else:
            time.sleep(0.1)
    return heard


def test_a_client_naming_the_frozen_standbys_releases_no_held_confirmation(make_cluster):
    """The real standbys are paused (their ZooKeeper sessions outlive the pause, so
    ZooKeeper still lists them): clients naming them with huge positions, and a made-up
    name, are not standbys. The publish stays held, and is confirmed once the real ones
    copy it."""
    c = make_cluster(settings=QUEUE, cluster_settings="replicas_ack = 1", heartbeat="5s",
                     session_timeout="10s").start()
    leader, epoch = c.leader()
    standbys = [n for n in c.names if n != leader]
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        client.publish("jobs", b"warm-up")
        wait_until(lambda: len(client.stats()["server"]["replication"]["cluster"]["isr"]) == 3, timeout=30,
                   interval=0.1, what="both standbys in sync")
    pub = raw_session(c.endpoint(leader), "publisher")
    fakes = {n: raw_session(c.endpoint(leader), f"zq standby {n}") for n in standbys + ["ghost"]}
    for n in standbys:
        c.signal(n, signal.SIGSTOP)
    try:
        pub.send(wire.encode(wire.Publish(1, "jobs", [(b"held", {}, "held")])))
        heard = lie(fakes, epoch, 2.5, watch=pub)
        assert not [f for f in heard if type(f) is wire.Confirm], heard
        st = c.state()
        assert st["leader"] == leader and "ghost" not in st["isr"], st
    finally:
        for n in standbys:
            c.signal(n, signal.SIGCONT)
    # The real standbys copy it: confirmed now.
    heard = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(type(f) is wire.Confirm for f in heard):
        heard += frames_for(pub, 0.2)
    assert any(type(f) is wire.Confirm for f in heard), (heard, c.tails())
    for s in [pub, *fakes.values()]:
        s.close(0)


def test_a_made_up_node_name_never_joins_the_in_sync_set(make_cluster):
    c = make_cluster(settings=QUEUE, cluster_settings="replicas_ack = 1", heartbeat="5s").start()
    leader, epoch = c.leader()
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        wait_until(lambda: len(client.stats()["server"]["replication"]["cluster"]["isr"]) == 3, timeout=30,
                   interval=0.1, what="both standbys in sync")
        fakes = {"ghost": raw_session(c.endpoint(leader), "zq standby ghost")}
        seen: set[str] = set()
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            lie(fakes, epoch, 0.3)
            seen |= set(c.state()["isr"])
        assert seen == set(c.names), seen
        rep = client.stats()["server"]["replication"]
        assert sorted(rep["cluster"]["isr"]) == sorted(c.names)
        assert "ghost" not in {s["node"] for s in rep["standbys"]}, rep["standbys"]
        assert rep["cluster"]["unproven"] >= 1  # (counted, and shown)
        # Still a cluster that confirms, and fails over.
        client.publish("jobs", b"after the ghost", timeout=30)
    fakes["ghost"].close(0)
    c.kill(leader)
    c.leader(other_than=leader, epoch_above=epoch, timeout=30)


def test_a_bounds_naming_a_far_newer_epoch_does_not_depose_the_leader(make_cluster):
    """ZooKeeper is asked; its epoch did not move, so the leader stays, and so do its
    clients' sessions (a raw one keeps being answered, a zq client's STATS too)."""
    c = make_cluster(settings=QUEUE, heartbeat="5s").start()
    leader, epoch = c.leader()
    session = raw_session(c.endpoint(leader), "a client")
    fake = raw_session(c.endpoint(leader), "liar")
    answers = []
    for i in range(20):
        answers.append(answer_to(fake, bounds(i + 1, 0, "", 2**62), 2))
        time.sleep(0.1)
    time.sleep(1.0)  # (a step-down would have happened by now: the checks are done in milliseconds)
    st = c.state()
    assert (st["leader"], st["epoch"]) == (leader, epoch), st
    assert all(type(a) is wire.Error and a.code == wire.NOT_LEADER for a in answers), answers
    got = answer_to(session, wire.encode(wire.Stats(99)))
    assert type(got) is wire.Reply, got  # the same session: not reset, not told to go elsewhere
    assert got.data["server"]["replication"]["cluster"]["epoch"] == epoch
    log = c.log(leader).read_text()
    assert "stepping down" not in log and "ZooKeeper still has epoch" in log, log[-3000:]
    for s in (session, fake):
        s.close(0)


HOSTILE_FRAMES = [
    b"\x93\xa5hello\x01\xa2\xff\xfe",  # HELLO whose name is not UTF-8
    b"\x93\xa3pub\x01\xa2\xc3\x28",  # PUBLISH, topic not UTF-8
    b"\xc1",  # not msgpack
    b"",  # empty
    b"\x92\xa5stats\xcf\xff\xff\xff\xff\xff\xff\xff\xff",  # a req past int64
    msgspec.msgpack.encode(["hello", "one", 7]),  # wrong types
    msgspec.msgpack.encode({"t": "hello"}),  # not an array
    msgspec.msgpack.encode(["bounds", 1, None, -1, 0, 2**62, "n1", 2**62, b"\xff"]),
    b"\xdd\xff\xff\xff\xff",  # an array claiming 4 G elements
    b"\x91" * 100_000,  # nested 100,000 deep
    b"\xff" * (1 << 20),  # a megabyte of garbage
]


def assert_answers_not_leader(endpoint: str, leader_endpoint: str) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        got = answer_to(sock, wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "after the hostile frames")), 10)
        assert type(got) is wire.Error and got.code == wire.NOT_LEADER and leader_endpoint in got.message, got
    finally:
        sock.close(0)


def send_hostile(endpoint: str) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(endpoint)
    for frame in HOSTILE_FRAMES:
        sock.send(frame)
    sock.send_multipart([b"two", b"parts"])
    time.sleep(0.5)
    sock.close()


def test_malformed_frames_at_a_standbys_endpoint_leave_it_answering(make_cluster):
    c = make_cluster(settings=QUEUE).start()
    leader, _ = c.leader()
    standby = next(n for n in c.names if n != leader)
    wait_until(lambda: answer_to(raw_dealer_to(c.endpoint(standby)), wire.encode(wire.Stats(1)), 1) is not None,
               timeout=30, interval=0.2, what="the standby answering")
    send_hostile(c.endpoint(standby))
    assert_answers_not_leader(c.endpoint(standby), c.endpoint(leader))
    # A zq client given only the standby's endpoint is sent on to the leader.
    with zq.connect(c.endpoint(standby), connect_timeout=30) as client:
        assert client.stats()["server"]["replication"]["cluster"]["node"] == leader


def raw_dealer_to(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


# ------------------------------------------------------------ a lone leader


def serve(tmp_path: Path, config: str, **kw) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "zq.toml"
    cfg.write_text(config)
    return subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--data", str(tmp_path / "journal"),
                             "--bind", f"ipc://{tmp_path}/zq.sock", "--config", str(cfg)], env=env(),
                            stderr=subprocess.PIPE, text=True, **kw)


def test_a_lone_leader_with_replicas_ack_and_no_way_to_prove_a_standby_refuses_to_start(tmp_path):
    """Without [security] and without a standby_secret, any client's BOUNDS would
    release a held confirmation: such a config is refused, saying what to add."""
    proc = serve(tmp_path, "[cluster]\nreplicas_ack = 1\n")
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("zq serve started with replicas_ack and no way to prove a standby")
    assert proc.returncode != 0 and "standby_secret" in err and "Traceback" not in err, err


def test_a_lone_leader_counts_only_a_standby_that_knows_its_secret(tmp_path):
    secret = "0123456789abcdef0123456789abcdef"
    cfg = tmp_path / "zq.toml"
    cfg.write_text(f'[cluster]\nreplicas_ack = 1\nstandby_secret = "{secret}"\n')
    (tmp_path / "a").mkdir()
    leader = ServerProcess(tmp_path / "a", config=cfg).start()
    follower = None
    try:
        pub = raw_session(leader.endpoint, "publisher")
        pub.send(wire.encode(wire.Publish(1, "jobs", [(b"held", {}, "held")])))
        fake = raw_session(leader.endpoint, "zq standby")
        for i, proof in enumerate(("", "wrong", secret[:-1], secret + "x", "é" * 32)):
            got = answer_to(fake, bounds(i + 1, 2**62, "", 0, proof))
            assert type(got) is wire.Error and got.code == "not-entitled", got
        assert not [f for f in frames_for(pub, 1.0) if type(f) is wire.Confirm]
        # A real standby given the secret: the confirmation goes.
        follower = subprocess.Popen([sys.executable, "-m", "zq.cli", "standby", leader.endpoint, "--data",
                                     str(tmp_path / "b"), "--status-every", "0.5"],
                                    env={**env(), "ZQ_STANDBY_SECRET": secret}, stderr=subprocess.PIPE, text=True)
        heard: list[object] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(type(f) is wire.Confirm for f in heard):
            heard += frames_for(pub, 0.2)
        assert any(type(f) is wire.Confirm for f in heard), heard
        with zq.connect(leader.endpoint) as c:
            assert [s["name"] for s in c.stats()["server"]["replication"]["standbys"]] == ["zq standby"]
        for s in (pub, fake):
            s.close(0)
    finally:
        if follower is not None:
            follower.terminate()
            _, err = follower.communicate(timeout=20)
            assert "Traceback" not in err, err
        assert "Traceback" not in leader.terminate()


def test_malformed_frames_at_a_hand_started_standbys_endpoint_leave_it_answering(tmp_path):
    (tmp_path / "a").mkdir()
    leader = ServerProcess(tmp_path / "a").start()
    bind = f"ipc://{tmp_path}/standby.sock"
    follower = subprocess.Popen([sys.executable, "-m", "zq.cli", "standby", leader.endpoint, "--data",
                                 str(tmp_path / "b"), "--bind", bind], env=env(), stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: answer_to(raw_dealer_to(bind), wire.encode(wire.Stats(1)), 1) is not None, timeout=30,
                   interval=0.2, what="the standby answering")
        send_hostile(bind)
        assert_answers_not_leader(bind, leader.endpoint)
    finally:
        follower.terminate()
        try:
            _, err = follower.communicate(timeout=20)
        finally:
            leader_err = leader.terminate()  # stopped whatever the follower said
        assert "Traceback" not in err, err
        assert "Traceback" not in leader_err
