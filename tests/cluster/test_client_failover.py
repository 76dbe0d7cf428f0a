"""Issue #31 §4, "a client follows its cluster": clients given ONE node's endpoint (or
the cluster's zk:// address) while that node leads; the leader is paused past its
ZooKeeper session (SIGSTOP) until another is elected, then resumed (SIGCONT): it wakes,
steps down and closes its socket. Every client kind (``zq.Publisher``, ``zq.Worker``,
``zq.connect``) must notice and be served by the new leader within seconds, by the same
rule (``zq.client.session.session_lost``), never after one of its own timeouts, and
nothing it had confirmed may be lost.

Real processes: three `zq serve` nodes, a real ZooKeeper (tests/cluster/conftest.py)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import zq

from tests.adapters.support import wait_until

# One queue per consumer: each has messages waiting whenever it is served (with one
# shared queue, whoever the dispatcher picks first takes what a slow publisher offers,
# and "served again" would measure that, not the client).
CONSUMED = ("c1", "w1", "wz")
QUEUES = "".join(f'[[queue]]\nname = "{q}"\nlease = "30s"\n\n' for q in (*CONSUMED, "idle"))
BOUND_S = 5.0  # served again within this of SIGCONT (their own timeouts are 30 s, the bug's 60 s)


class Loop:
    """One client in its own thread, calling ``step`` until stopped; when it made
    progress (a confirmation, a message) and what it was."""

    def __init__(self, name: str, step: Callable[["Loop"], None]) -> None:
        self.name = name
        self.step = step
        self.progress: list[float] = []
        self.done: list[tuple[str, str]] = []  # (topic, payload) confirmed, or processed
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.step(self)
            except BaseException as exc:  # noqa: BLE001 -- reported by the test
                self.errors.append(exc)
                return

    def made(self, topic: str, payload: str) -> None:
        self.done.append((topic, payload))
        self.progress.append(time.monotonic())

    def first_after(self, t: float) -> float | None:
        return next((p - t for p in self.progress if p > t), None)


def publishing(name: str, publish: Callable[..., object]) -> Loop:
    """Publishes to each consumer's queue in turn, with ids (a publish resent after a
    lost session is deduplicated)."""
    counter = iter(range(10**9))

    def step(loop: Loop) -> None:
        i = next(counter)
        topic, payload = CONSUMED[i % len(CONSUMED)], f"{name}:{i}"
        publish(topic, payload.encode(), msg_id=payload, timeout=30)
        loop.made(topic, payload)
        time.sleep(0.02)

    return Loop(name, step)


def consuming(name: str, topic: str, get: Callable[[float], object]) -> Loop:
    def step(loop: Loop) -> None:
        msg = get(0.2)
        if msg is not None:
            loop.made(topic, msg.data.decode())  # type: ignore[attr-defined]
            msg.ack()  # type: ignore[attr-defined]

    return Loop(name, step)


def test_every_client_given_one_node_follows_it_when_it_pauses_past_its_session_and_steps_down(make_cluster):
    c = make_cluster(settings=QUEUES, cluster_settings="replicas_ack = 1").start()
    old, epoch = c.leader()
    one, zk = c.endpoint(old), f"zk://{c.zookeeper}{c.path}"
    opened: list = []

    def keep(x):  # type: ignore[no-untyped-def]
        opened.append(x)
        return x

    # Busy: calling all through the pause.
    pub_one, pub_zk = keep(zq.Publisher(one, connect_timeout=30)), keep(zq.Publisher(zk, connect_timeout=30))
    client_one, client_zk = keep(zq.connect(one, connect_timeout=30)), keep(zq.connect(zk, connect_timeout=30))
    sub_one = client_one.subscribe("c1", max_backlog=4)
    worker_one = keep(zq.Worker(one, "w1", max_backlog=4, connect_timeout=30))
    worker_zk = keep(zq.Worker(zk, "wz", max_backlog=4, connect_timeout=30))
    publishers = [publishing("Publisher(one node)", pub_one.publish), publishing("Publisher(zk://)", pub_zk.publish),
                  publishing("zq.connect(one node).publish", client_one.publish),
                  publishing("zq.connect(zk://).publish", client_zk.publish)]
    consumers = [consuming("zq.connect(one node).subscribe", "c1", sub_one.get),
                 consuming("Worker(one node)", "w1", worker_one.get), consuming("Worker(zk://)", "wz", worker_zk.get)]
    busy = publishers + consumers
    # Idle: used before the pause, next called after the old leader stepped down.
    idle_pub = keep(zq.Publisher(one, connect_timeout=30))
    idle_worker = keep(zq.Worker(one, "idle", max_backlog=4, connect_timeout=30))
    idle_pub.publish("idle", b"idle:0", msg_id="idle:0")
    m = idle_worker.get(10)
    assert m is not None and m.data == b"idle:0"
    m.ack()
    idle_worker.heartbeat()
    for loop in busy:
        loop.thread.start()
    try:
        wait_until(lambda: all(loop.progress for loop in busy) or any(loop.errors for loop in busy), timeout=30,
                   interval=0.05, what="every client served before the pause")
        c.signal(old, signal.SIGSTOP)
        new, new_epoch = c.leader(other_than=old, epoch_above=epoch, timeout=30)
        resumed = time.monotonic()
        c.signal(old, signal.SIGCONT)
        # Each busy client is served again (the new leader confirms, or delivers), well
        # before any of its own timeouts.
        while (time.monotonic() < resumed + 3 * BOUND_S and not any(loop.errors for loop in busy)
               and not all(loop.first_after(resumed) is not None for loop in busy)):
            time.sleep(0.05)
        assert not [loop.errors for loop in busy if loop.errors]
        served = {loop.name: loop.first_after(resumed) for loop in busy}
        print(f"served again, seconds after SIGCONT: { {k: v and round(v, 2) for k, v in served.items()} }")
        assert all(s is not None and s < BOUND_S for s in served.values()), served
        wait_until(lambda: "stepping down" in c.log(old).read_text(), timeout=20, what="the old leader stepped down")
        # The idle ones, called only now.
        t = time.monotonic()
        idle_pub.publish("idle", b"idle:1", msg_id="idle:1", timeout=30)
        idle_publish_s = time.monotonic() - t
        t = time.monotonic()
        while (m := idle_worker.get(30)) is not None and m.data == b"idle:0":  # (at least once: its ack may
            m.ack()                                                           # not have been copied)
        idle_get_s = time.monotonic() - t
        assert m is not None and m.data == b"idle:1", m
        m.ack()
        print(f"idle publisher: {idle_publish_s:.2f}s, idle worker: {idle_get_s:.2f}s")
        assert idle_publish_s < BOUND_S and idle_get_s < BOUND_S, (idle_publish_s, idle_get_s)
        # Every one of them is on the new leader's epoch.
        assert pub_one._endpoints.epoch == pub_zk._endpoints.epoch == idle_pub._endpoints.epoch == new_epoch
        assert client_one.endpoints.epoch == client_zk.endpoints.epoch == new_epoch
        assert worker_one._endpoints.epoch == worker_zk._endpoints.epoch == idle_worker._endpoints.epoch == new_epoch
        assert client_one.stats()["server"]["replication"]["cluster"]["node"] == new
        # Nothing confirmed is lost: each consumer processes every message confirmed to its queue.
        time.sleep(0.5)
        for loop in publishers:
            loop.stop.set()
        for loop in publishers:
            loop.thread.join(60)
        confirmed = {x for loop in publishers for x in loop.done}

        def processed() -> set[tuple[str, str]]:
            return {x for loop in consumers for x in loop.done}

        wait_until(lambda: confirmed <= processed() or any(loop.errors for loop in consumers), timeout=30,
                   interval=0.1, what="every confirmed message processed")
        assert not [loop.errors for loop in consumers if loop.errors]
        missing = sorted(confirmed - processed())
        assert not missing, missing[:10]
    finally:
        for loop in busy:
            loop.stop.set()
        for loop in busy:
            loop.thread.join(60)
        for x in opened:
            x.close()


def test_a_zk_client_bounced_between_a_standby_and_a_gone_leader_reads_zookeeper_again(zookeeper):
    """A zk:// client reads the cluster's endpoints once, the leader first, and again each
    time it has tried through them. A standby that still names the old leader (it has
    not heard of the new one yet) sent it back there, and from there to the standby
    again: hints kept it off the list's end, so ZooKeeper was never read again, and a
    leader elected after the list was read (a node that joined late) was never tried.
    Now as many failures as the list is long, hints included, read ZooKeeper again.
    A real ZooKeeper: the znodes are the ones ``zq.server.election`` keeps."""
    import msgspec
    from kazoo.client import KazooClient

    from zq.client.session import Endpoints

    path = "/zq/bounced_client"
    old, standby, new = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3"
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(timeout=10)
    try:
        zk.create(f"{path}/state", msgspec.json.encode({"epoch": 1, "leader": "n1", "endpoint": old}), makepath=True)
        zk.create(f"{path}/nodes/n1", msgspec.json.encode({"endpoint": old}), makepath=True)
        zk.create(f"{path}/nodes/n2", msgspec.json.encode({"endpoint": standby}))
        ring = Endpoints(f"zk://{zookeeper.hosts}{path}")
        assert ring.all == [old, standby]
        # The new leader, elected after the client read the list.
        zk.set(f"{path}/state", msgspec.json.encode({"epoch": 2, "leader": "n3", "endpoint": new}))
        zk.create(f"{path}/nodes/n3", msgspec.json.encode({"endpoint": new}))
        ring.failed()  # the old leader went silent
        assert ring.current == standby
        ring.redirect(f"this dispatcher is a standby, not the leader; leader: {old}")
        ring.failed()  # (the redirect is followed)
        assert ring.current == old
        ring.failed()  # silent again: two failures, as many as the list holds
        assert ring.all[0] == new and ring.current == new
    finally:
        zk.delete(path, recursive=True)
        zk.stop()
        zk.close()



def test_a_zk_address_where_no_zookeeper_answers_is_a_connection_error_not_a_crash():
    """What a zk:// client gets when ZooKeeper is not there: ConnectionLost naming it,
    within the 5 s connect wait (any kazoo failure becomes one: a client's I/O thread
    must not die of it)."""
    import socket

    import pytest

    from zq.client.session import Endpoints
    from zq.core.errors import ConnectionLost

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ConnectionLost, match="no ZooKeeper answered"):
        Endpoints(f"zk://127.0.0.1:{port}/zq/nobody")
    assert time.monotonic() - started < 15
