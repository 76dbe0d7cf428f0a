"""An elected cluster over real processes: three `zq serve` nodes, a real ZooKeeper,
clients given every node's endpoint. The leader is SIGKILLed under load (twice), paused
past its session (SIGSTOP, then resumed: it must confirm and deliver nothing more), a
standby is killed; a checker holds confirmed publishes and processed messages to: no
confirmed message lost, nothing acknowledged (and replicated) delivered again, groups
in order."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import zmq

import zq
from zq import wire
from zq.core.errors import ResumePointError
from zq.journal import replica
from zq.journal.lmdb_journal import LmdbJournal

from tests.adapters.support import frames_for, raw_session, wait_until

QUEUE = '[[queue]]\nname = "jobs"\nlease = "30s"\n'


def test_three_nodes_elect_one_leader_and_the_standbys_copy_it_in_sync(make_cluster):
    c = make_cluster(settings=QUEUE, cluster_settings="replicas_ack = 1").start()
    leader, epoch = c.leader()
    assert epoch >= 1
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        bookmarks = client.publish_many("jobs", [b"m%d" % i for i in range(200)])
        assert len(bookmarks) == 200

        def replication():
            return client.stats()["server"]["replication"]

        wait_until(lambda: len(replication()["cluster"]["isr"]) == 3, timeout=20, interval=0.1,
                   what="both standbys in sync")
        rep = replication()
        assert rep["cluster"]["role"] == "leader" and rep["cluster"]["node"] == leader
        assert rep["cluster"]["epoch"] == epoch and rep["cluster"]["serving"] is True
        assert sorted(s["node"] for s in rep["standbys"]) == sorted(set(c.names) - {leader})
        assert all(s["in_sync"] and s["lag_ms"] is not None for s in rep["standbys"])
        assert c.state()["leader"] == leader and sorted(c.state()["isr"]) == sorted(c.names)
    # `zq stats` says it under its table.
    import subprocess
    import sys

    from tests.adapters.support import env

    out = subprocess.run([sys.executable, "-m", "zq.cli", "stats", "-e", c.endpoints], env=env(), capture_output=True,
                         text=True, timeout=60).stdout
    assert f"cluster: leader {leader}, epoch {epoch}, in sync: {', '.join(sorted(c.names))}" in out, out
    for n in set(c.names) - {leader}:
        assert f"standby {n}: lag " in out and " ms" in out, out
    # A client given the cluster's ZooKeeper address finds the leader there; the CLI too.
    with zq.connect(f"zk://{c.zookeeper}{c.path}", connect_timeout=30) as client:
        assert client.endpoints.all[0] == c.endpoint(leader) and len(client.endpoints.all) == 3
        assert client.stats()["server"]["replication"]["cluster"]["node"] == leader
    out = subprocess.run([sys.executable, "-m", "zq.cli", "stats", "-e", f"zk://{c.zookeeper}{c.path}"], env=env(),
                         capture_output=True, text=True, timeout=60)
    assert f"cluster: leader {leader}" in out.stdout, out.stdout + out.stderr
    from zq.core.errors import ConnectionLost

    with pytest.raises(ConnectionLost, match="no zq cluster"):
        zq.connect(f"zk://{c.zookeeper}/zq/no_such_cluster", connect_timeout=5)
    # A client given one standby's endpoint is sent to the leader.
    standby = next(n for n in c.names if n != leader)
    with zq.connect(c.endpoint(standby), connect_timeout=30) as client:
        assert client.stats()["server"]["replication"]["cluster"]["node"] == leader


def publish_and_process(c, kills: int, per_phase: int, groups: int = 4):
    """A publisher (message ids, groups) and a worker, both given every endpoint, while
    the leader is SIGKILLed ``kills`` times (each time started again as a standby).
    Returns (confirmed ids, processed payloads in order, epochs seen)."""
    confirmed: list[str] = []
    processed: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            with zq.Publisher(c.endpoints, connect_timeout=30) as p:
                i = 0
                while not stop.is_set() and i < per_phase * (kills + 1):
                    g = i % groups
                    p.publish("jobs", f"{g}:{i}", group=f"g{g}", msg_id=f"m{i}", timeout=60)
                    confirmed.append(f"{g}:{i}")
                    i += 1
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            errors.append(exc)

    def work() -> None:
        try:
            with zq.Worker(c.endpoints, "jobs", max_backlog=4, connect_timeout=30) as w:
                while not stop.is_set():
                    m = w.get(0.2)
                    if m is not None:
                        processed.append(m.data.decode())
                        m.ack()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=publish), threading.Thread(target=work)]
    for t in threads:
        t.start()
    epochs = [c.leader()[1]]
    try:
        for k in range(kills):
            wait_until(lambda: len(confirmed) >= per_phase * (k + 1) or errors, timeout=60, interval=0.05,
                       what=f"{per_phase * (k + 1)} confirmed")
            assert not errors, errors
            leader, epoch = c.leader()
            c.kill(leader)
            _, new_epoch = c.leader(other_than=leader, epoch_above=epoch, timeout=30)
            epochs.append(new_epoch)
            c.start(leader)  # back, as a standby of the new leader
        wait_until(lambda: len(confirmed) >= per_phase * (kills + 1) or errors, timeout=90, interval=0.05,
                   what="every message confirmed")
        assert not errors, errors
        wait_until(lambda: set(confirmed) <= set(processed) or errors, timeout=60, interval=0.05,
                   what="every confirmed message processed")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    return confirmed, processed, epochs


def test_the_leader_sigkilled_under_load_twice_loses_no_confirmed_message(make_cluster):
    c = make_cluster(settings=QUEUE, cluster_settings="replicas_ack = 1").start()
    c.leader()
    confirmed, processed, epochs = publish_and_process(c, kills=2, per_phase=150)
    assert epochs == sorted(set(epochs)) and len(epochs) == 3, epochs
    # No confirmed message lost: every one processed.
    assert set(confirmed) <= set(processed), sorted(set(confirmed) - set(processed))[:10]
    # Each group's messages were first processed in the order published.
    first_seen: dict[str, list[int]] = {}
    seen = set()
    for p in processed:
        if p not in seen:
            seen.add(p)
            g, i = p.split(":")
            first_seen.setdefault(g, []).append(int(i))
    for g, order in first_seen.items():
        assert order == sorted(order), (g, order)
    # At least once: only what was in flight at a kill comes twice (a worker's backlog
    # of 4 a kill, and the group's one at a time).
    twice = len(processed) - len(set(processed))
    assert twice <= 2 * 8, twice


def test_an_acknowledged_and_replicated_message_is_not_delivered_again(make_cluster):
    c = make_cluster(settings=QUEUE, cluster_settings="replicas_ack = 1").start()
    leader, epoch = c.leader()
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        client.publish_many("jobs", [b"job %d" % i for i in range(50)])
        done = []
        with client.subscribe("jobs", max_backlog=10) as s:
            for _ in range(30):
                m = s.get(10)
                m.ack()
                done.append(m.bookmark)
        # Confirmed on the same session after the acks: the standbys have every record
        # before it, the ack events included.
        client.publish("jobs", b"marker")
    c.kill(leader)
    new, new_epoch = c.leader(other_than=leader, epoch_above=epoch)
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        assert client.stats()["server"]["replication"]["cluster"]["epoch"] == new_epoch
        got = take(client, 21)
        assert len(got) == 21 and not set(done) & set(got), sorted(set(done) & set(got))


def take(client, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Subscribe to "jobs" and ack what comes, up to ``n`` messages (or 5 s of none);
    their bookmarks."""
    got: list[int] = []
    with client.subscribe("jobs", max_backlog=min(n, 1000)) as s:
        while len(got) < n and (m := s.get(5)) is not None:
            got.append(m.bookmark)
            m.ack()
    return got


def test_a_leader_paused_past_its_session_confirms_and_delivers_nothing_after(make_cluster):
    """SIGSTOP the leader for 3 s (session 2 s): a standby takes over. Frames a publisher
    and a consumer on the old leader's endpoint sent meanwhile wait in its socket; when it
    runs again its lease is long past, so it sends no CONFIRM and no DELIVER: it steps
    down, truncates what the new leader never had, and names the new leader."""
    # Heartbeats of 5 s: the raw sessions below send none and must not be dropped as silent.
    c = make_cluster(settings=QUEUE, cluster_settings="replicas_ack = 1", heartbeat="5s").start()
    old, epoch = c.leader()
    pub, con = raw_session(c.endpoint(old)), raw_session(c.endpoint(old))
    pub.send(wire.encode(wire.Publish(1, "jobs", [(b"before", {}, "before")])))
    assert any(type(f) is wire.Confirm for f in frames_for(pub, 3)), "the leader confirms while it leads"
    c.signal(old, signal.SIGSTOP)
    new, new_epoch = c.leader(other_than=old, epoch_above=epoch, timeout=30)
    # Sent to the paused leader: a publish, and a subscription that could take "before".
    pub.send(wire.encode(wire.Publish(2, "jobs", [(b"after", {}, "after")])))
    con.send(wire.encode(wire.Subscribe(1, "s", "jobs", 10)))
    c.signal(old, signal.SIGCONT)
    heard = frames_for(pub, 4) + frames_for(con, 1)
    kinds = {type(f).__name__ for f in heard}
    assert not {"Confirm", "DeliverRaw", "DeliverRecords", "Subscribed"} & kinds, heard
    # It steps down and follows the new leader: its endpoint names it.
    with zq.connect(c.endpoint(old), connect_timeout=30) as client:
        rep = client.stats()["server"]["replication"]["cluster"]
        assert rep["node"] == new and rep["epoch"] == new_epoch
        # "after" was never confirmed: not on the new leader (the client would resend it).
        with client.subscribe("jobs", max_backlog=10) as s:
            got = []
            while (m := s.get(3)) is not None:
                got.append(m.data)
                m.ack()
        assert got == [b"before"], got
    wait_until(lambda: "stepping down" in c.log(old).read_text(), timeout=20, what="the old leader stepped down")
    for s in (pub, con):
        s.close(0)


def test_a_deposed_leader_truncates_what_the_new_leader_never_had(make_cluster):
    """With replicas_ack = 0 a leader confirms on its own commit; records its standbys
    never copied are gone with it at a failover. When it comes back it deletes them
    (KIP-101): its journal matches the new leader's, record for record."""
    c = make_cluster(settings=QUEUE, cluster_settings="replicas_ack = 0").start()
    old, epoch = c.leader()
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        client.publish_many("jobs", [b"shared %d" % i for i in range(100)])
        wait_until(lambda: len(client.stats()["server"]["replication"]["cluster"]["isr"]) == 3, timeout=20,
                   interval=0.1, what="standbys in sync")
    # The standbys stop copying (paused), the leader takes 50 more, then dies.
    others = [n for n in c.names if n != old]
    for n in others:
        c.signal(n, signal.SIGSTOP)
    with zq.connect(c.endpoint(old), connect_timeout=30) as client:
        lost_bookmarks = client.publish_many("jobs", [b"lost %d" % i for i in range(50)])
    c.kill(old)
    for n in others:
        c.signal(n, signal.SIGCONT)
    new, new_epoch = c.leader(other_than=old, epoch_above=epoch, timeout=30)
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        # A reader that had got to the end of the lost records is told where to resume.
        with pytest.raises(ResumePointError, match=r"resume from (\d+)") as err:
            client.replay("jobs", start=lost_bookmarks[-1] + 1)
        resume = int(err.value.args[0].rpartition(" ")[2])
        assert resume <= lost_bookmarks[0]  # where the new leader's epoch began (checked below)
        client.publish_many("jobs", [b"new %d" % i for i in range(30)])
    c.start(old)
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        wait_until(lambda: old in client.stats()["server"]["replication"]["cluster"]["isr"], timeout=30,
                   interval=0.1, what="the old leader back in sync")
    c.stop(old)
    c.stop(new)
    mine, theirs = LmdbJournal(str(c.data(old)), readonly=True), LmdbJournal(str(c.data(new)), readonly=True)
    try:
        assert [m.payload for m in mine.read_messages(0)] == [m.payload for m in theirs.read_messages(0)]
        assert not any(m.payload.startswith(b"lost") for m in mine.read_messages(0))
        assert replica.epochs(mine) == replica.epochs(theirs) and replica.epochs(mine)[-1] == (new_epoch, resume)
    finally:
        mine.close()
        theirs.close()
    assert "deleted 50 records" in c.log(old).read_text()


def test_bad_cluster_addresses_are_refused_in_the_callers_thread():
    for bad in ("zk://", "zk://host:2181", "zk://host:2181/", "zk://h:1/a b", "zk://h:1/" + "x" * 65,
                "zk://" + "h" * 300 + "/zq", "zk://h:1/zq/../x/" + "/a" * 10):
        with pytest.raises(ValueError, match="cluster address"):
            zq.connect(bad, connect_timeout=1)


@pytest.mark.parametrize("bad, says", [
    ('zookeeper = "127.0.0.1:2181"\nnode = "n 1"', "cluster.node"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "' + "n" * 65 + '"', "cluster.node"),
    ('zookeeper = "127.0.0.1:2181/chroot"\nnode = "n1"', "cluster.zookeeper"),
    ('zookeeper = "' + "h" * 5000 + '"\nnode = "n1"', "cluster.zookeeper"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\npath = "zq"', "cluster.path"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\npath = "/zq/../x"', "cluster.path"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\nsession_timeout = "500ms"', "cluster.session_timeout"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\nsession_timeout = "1h"', "cluster.session_timeout"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\nsession_timeout = 2', "session_timeout"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\nmin_insync = 17', "cluster.min_insync"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\nmin_insync = -1', "cluster.min_insync"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\nreplica_lag = "1ms"', "cluster.replica_lag"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\nadvertise = "tcp://*:7780"', "cluster.advertise"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\nadvertise = "ipc:///tmp/x"', "cluster.advertise"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\nreplicas_ack = 99999999999999999999', "cluster"),
    ('zookeeper = "127.0.0.1:2181"\nnode = "n1"\nelection = "raft"', "election"),
])
def test_bad_cluster_settings_are_refused_by_name(tmp_path, bad, says):
    from zq.core.errors import ConfigError
    from zq.server.config import Config

    p = tmp_path / "zq.toml"
    p.write_text(f"[cluster]\n{bad}\n")
    with pytest.raises(ConfigError) as err:
        Config.load(p)
    assert says in str(err.value)


def test_the_loopback_cluster_example_shows_a_failover(zookeeper):
    """examples/cluster_loopback.py, as a user runs it (on this session's ZooKeeper)."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.adapters.support import env

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "examples" / "cluster_loopback.py"), "--jobs", "120",
                           "--zookeeper", zookeeper.hosts], env=env(), capture_output=True, text=True, timeout=180,
                          cwd=root)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "every confirmed job processed: True" in done.stdout, done.stdout
    assert "leads epoch 2" in done.stdout and "Traceback" not in done.stderr, done.stdout + done.stderr


def test_everything_killed_and_started_again_comes_back_with_every_confirmed_message(make_cluster):
    """SIGKILL all three nodes at once, start them again: an in-sync node is elected as
    a newer epoch and serves every confirmed message; a standby SIGKILLed and started
    again rejoins the in-sync set."""
    c = make_cluster(settings=QUEUE, cluster_settings="replicas_ack = 1").start()
    leader, epoch = c.leader()
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        sent = client.publish_many("jobs", [b"job %d" % i for i in range(300)])
        standby = next(n for n in c.names if n != leader)
        c.kill(standby)
        more = client.publish_many("jobs", [b"more %d" % i for i in range(50)])  # the other standby confirms
        c.start(standby)
        wait_until(lambda: standby in client.stats()["server"]["replication"]["cluster"]["isr"], timeout=30,
                   interval=0.1, what="the restarted standby back in sync")
    for n in c.names:
        c.kill(n)
    c.start()
    _, again = c.leader(epoch_above=epoch, timeout=60)
    # Started again before their old sessions expired, each node still ends up listed
    # (its member znode, what zk:// clients read), once the old one is gone.
    from zq.client.session import cluster_endpoints

    wait_until(lambda: len(cluster_endpoints(f"zk://{c.zookeeper}{c.path}")) == 3, timeout=30, interval=0.2,
               what="all three nodes listed in ZooKeeper again")
    with zq.connect(c.endpoints, connect_timeout=60) as client:
        got = take(client, len(sent) + len(more))
        assert sorted(got) == sorted(sent + more)
        assert client.stats()["server"]["replication"]["cluster"]["epoch"] == again > epoch


def test_a_leader_stopped_cleanly_leaves_nothing_it_confirmed_behind(make_cluster):
    """replicas_ack = 0: confirmations follow the leader's own commit. The standbys are
    held back (paused) while it confirms 300 more and is asked to stop (SIGTERM); they
    resume half a second later: it waited for them to hold everything before it let go,
    so the new leader serves all of them."""
    c = make_cluster(settings=QUEUE, cluster_settings="replicas_ack = 0").start()
    old, epoch = c.leader()
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        first = client.publish_many("jobs", [b"a %d" % i for i in range(100)])
        wait_until(lambda: len(client.stats()["server"]["replication"]["cluster"]["isr"]) == 3, timeout=20,
                   interval=0.1, what="standbys in sync")
        others = [n for n in c.names if n != old]
        for n in others:
            c.signal(n, signal.SIGSTOP)
        try:
            later = client.publish_many("jobs", [b"b %d" % i for i in range(300)])  # confirmed: not copied yet
            c.signal(old, signal.SIGTERM)  # asked to stop while no standby has them
            time.sleep(0.5)  # (the fault's timing: the standbys come back half a second later)
        finally:
            for n in others:
                c.signal(n, signal.SIGCONT)
    assert c.exited(old) == 0  # (a second SIGTERM would stop it at once: none is sent)
    new, _ = c.leader(other_than=old, epoch_above=epoch)
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        got = take(client, 400)
    assert sorted(got) == sorted(first + later)
    assert "waiting (at most" in c.log(old).read_text()


def test_a_secured_cluster_elects_copies_and_fails_over_with_keys(make_cluster, tmp_path):
    """CurveZMQ on every node: the nodes' standbys copy the leader as clients with their
    own key (entitled to read the journal and nothing else), so replicated confirmations
    work; after the leader's SIGKILL a client with its key follows the new leader; a
    plaintext client gets nothing from any node."""
    import shutil
    import subprocess
    import sys

    from zq.core.errors import ConnectionLost

    from tests.adapters.support import env

    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    allowed.mkdir()
    for name in ("server", "node", "alice"):
        done = subprocess.run([sys.executable, "-m", "zq.cli", "keygen", name, "--dir", str(keys)], env=env(),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    for name in ("node", "alice"):
        shutil.copy(keys / f"{name}.key", allowed)
    security = (f'[security]\nsecret_key = "{keys}/server.key_secret"\nallow = "{allowed}"\n\n'
                f'[[security.client]]\nkey = "{keys}/node.key"\nname = "node"\npublish = []\nconsume = []\n'
                f'browse = ["*"]\nclaim = []\nadmin = ["journal-tables", "epoch-end", "snapshot-*"]\n')
    c = make_cluster(settings=QUEUE + "\n" + security, cluster_settings="replicas_ack = 1",
                     env={"ZQ_KEY": str(keys / "node.key_secret"), "ZQ_SERVER_KEY": str(keys / "server.key")}).start()
    leader, epoch = c.leader()
    creds = {"key": str(keys / "alice.key_secret"), "server_key": str(keys / "server.key")}
    with zq.connect(c.endpoints, connect_timeout=30, **creds) as client:
        before = client.publish_many("jobs", [b"s %d" % i for i in range(100)])  # confirmed: a standby copied them
        wait_until(lambda: len(client.stats()["server"]["replication"]["cluster"]["isr"]) == 3, timeout=20,
                   interval=0.1, what="both standbys in sync")
    with pytest.raises(ConnectionLost):
        zq.connect(c.endpoints, connect_timeout=3)  # plaintext
    c.kill(leader)
    c.leader(other_than=leader, epoch_above=epoch)
    with zq.connect(c.endpoints, connect_timeout=30, **creds) as client:
        after = client.publish_many("jobs", [b"t %d" % i for i in range(50)])
        got = take(client, 150)
        assert sorted(got) == sorted(before + after)


@pytest.mark.parametrize("toml, args, says", [
    ('[cluster]\nzookeeper = "127.0.0.1:1"\n', ["--node", "n 1"], "cluster.node (or --node)"),
    ('[cluster]\nzookeeper = "127.0.0.1:1"\n', ["--node", "x" * 10_000], "cluster.node (or --node)"),
    ('[cluster]\nzookeeper = "127.0.0.1:1"\n', [], "cluster.node (or --node)"),  # no name anywhere
    ('[cluster]\nreplicas_ack = 1\nstandby_secret = "0123456789abcdef"\n', ["--node", "n1"],
     "--node needs a [cluster] block with zookeeper"),
    ('[cluster]\nzookeeper = "127.0.0.1:1"\nnode = "n1"\n', ["--bind", "tcp://*:7781"], "cluster.advertise"),
])
def test_zq_serve_refuses_a_bad_node_setting_with_a_usage_error(tmp_path, toml, args, says):
    import subprocess
    import sys

    from tests.adapters.support import env

    cfg = tmp_path / "zq.toml"
    cfg.write_text(toml)
    done = subprocess.run([sys.executable, "-m", "zq.cli", "serve", "-c", str(cfg), "--data", str(tmp_path / "d"),
                           *args], env=env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_lone_dispatcher_refuses_a_cluster_config(tmp_path):
    """An embedded or hand-built Server with a [cluster] that names ZooKeeper would serve
    unelected and unfenced beside the cluster's leader: it refuses, saying how to run one."""
    from zq.core.errors import ConfigError
    from zq.server.config import Config
    from zq.server.loop import Server

    cfg = Config.from_dict({"server": {"data": str(tmp_path / "d"), "bind": ["ipc://" + str(tmp_path / "s")]},
                            "cluster": {"zookeeper": "127.0.0.1:1", "node": "n1", "advertise": "tcp://10.0.0.5:7780"}})
    with pytest.raises(ConfigError, match="served by its nodes"):
        Server(cfg)
