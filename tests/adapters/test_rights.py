"""Rights belong to an authenticated key, not to a routing id (issue #32 §1), over real
sockets against an in-process dispatcher: routing ids are unpredictable and never
shown; an in-process session's id cannot be taken by a remote peer; a frame from
another key than its session's is not handled under that session; a reload ends the
sessions whose key lost its rights; queue settings are checked against the creating
key's rights; STATS and QUEUES show a key only what it may see."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.auth

import zq
from zq import wire
from zq.core.errors import ConnectionLost, NotEntitledError
from zq.server.config import Config
from zq.server.security import ClientSection, Rights, SecuritySection, check_section

from .support import env, wait_until

NARROW = {"publish": ["carol.*"], "consume": ["carol.*"], "browse": [], "claim": [], "admin": ["queue-create"]}


@pytest.fixture
def keys(tmp_path: Path) -> dict:
    kdir, allowed = tmp_path / "keys", tmp_path / "allowed"
    kdir.mkdir()
    allowed.mkdir()
    out = {"dir": tmp_path, "allowed": allowed}
    for name in ("server", "alice", "mallory", "carol", "bob"):
        pub, sec = zmq.auth.create_certificates(str(kdir), name)
        out[name] = (Path(pub), Path(sec))
        Path(sec).chmod(0o600)
        if name != "server":
            shutil.copy(pub, allowed)
    return out


def section(keys: dict, **rules: dict) -> SecuritySection:
    clients = [ClientSection(key=str(keys[name][0]), name=name, **r) for name, r in rules.items()]
    return check_section(SecuritySection(secret_key=str(keys["server"][1]), allow=str(keys["allowed"]),
                                         client=clients), keys["dir"])


@pytest.fixture
def secured(keys: dict):
    sec = section(keys, mallory={k: [] for k in NARROW}, carol=NARROW, bob={"publish": ["*"]})
    d = zq.Dispatcher(Config(data=str(keys["dir"] / "d"), bind=["tcp://127.0.0.1:0"], security=sec,
                             heartbeat_ms=5000)).start()
    yield d, keys
    d.stop()


class Raw:
    """A CURVE DEALER speaking ZQP/1 by hand (``routing_id``: the id it chooses)."""

    def __init__(self, endpoint: str, keys: dict, name: str, routing_id: bytes | None = None) -> None:
        pub, sec = zmq.auth.load_certificate(str(keys[name][1]))
        server_pub, _ = zmq.auth.load_certificate(str(keys["server"][0]))
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.curve_publickey, self.sock.curve_secretkey, self.sock.curve_serverkey = pub, sec, server_pub
        if routing_id is not None:
            self.sock.setsockopt(zmq.ROUTING_ID, routing_id)
        self.sock.connect(endpoint)

    def send(self, cmd: object) -> None:
        self.sock.send(wire.encode(cmd))

    def recv(self, timeout: float = 5.0) -> object:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.sock.poll(100):
                msg = wire.server_decoder.decode(self.sock.recv())
                if type(msg) is not wire.Heartbeat:
                    return msg
        raise TimeoutError("no answer")

    def ask(self, cmd: object, timeout: float = 5.0) -> object:
        self.send(cmd)
        return self.recv(timeout)

    def hello(self, name: str = "raw") -> object:
        return self.ask(wire.Hello(wire.PROTOCOL_VERSION, name))

    def close(self) -> None:
        self.sock.close(0)


def client(d: zq.Dispatcher, keys: dict, name: str) -> zq.Client:
    return zq.connect(d.endpoint, key=str(keys[name][1]), server_key=str(keys["server"][0]), connect_timeout=10)


# ------------------------------------------------------- (1) routing ids

FIRST_UNSEEDED_ID = "006b8b4567"  # libzmq 4.3.5's first generated id when rand() was never seeded

PROBE = """
import sys, zmq
from zq.server.config import Config
from zq.server.router import open_router
ctx = zmq.Context()
r = open_router(Config(data=sys.argv[1], bind=["tcp://127.0.0.1:0"]), ctx)
d = ctx.socket(zmq.DEALER); d.linger = 0; d.connect(r.endpoints[0]); d.send(b"x")
print(r.sock.recv_multipart()[0].hex()); d.close(); r.close()
"""


def test_generated_routing_ids_start_somewhere_new_in_every_process(tmp_path):
    ids = [subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / str(i))], env=env(), capture_output=True,
                          text=True, timeout=60).stdout.strip() for i in range(2)]
    assert all(len(i) == 10 and i.startswith("00") for i in ids), ids
    assert FIRST_UNSEEDED_ID not in ids and ids[0] != ids[1], ids


def test_stats_name_sessions_by_label_never_by_routing_id(secured):
    d, keys = secured
    rid = b"alice-chosen-id"
    alice = Raw(d.endpoint, keys, "alice", routing_id=rid)
    try:
        assert type(alice.hello("alice")) is wire.Welcome
        assert type(alice.ask(wire.Subscribe(1, "s", "jobs", 1, None, False))) is wire.Subscribed
        st = alice.ask(wire.Stats(2))
        text = json.dumps(msgspec.to_builtins(st.data))  # type: ignore[attr-defined]
        assert rid.hex() not in text and rid.decode() not in text
        labels = [p["consumer"] for p in st.data["peers"] if p["name"] == "alice"]  # type: ignore[attr-defined]
        assert len(labels) == 1 and st.data["queues"]["jobs"]["consumers"][0]["consumer"] == labels[0]  # type: ignore[attr-defined]
    finally:
        alice.close()


# --------------------------------------------------- (2) in-process links

def test_a_remote_peer_cannot_take_an_in_process_session(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"])).start()
    try:
        with zq.Worker(d, "jobs", max_backlog=4) as w, zq.Publisher(d) as p:
            server = d.server
            assert server is not None
            local_ids = list(server.links)
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.linger = 0
            for serial in range(1, 4):  # the ids local links had: b"\x00zq-local" + an 8-byte serial
                sock.setsockopt(zmq.ROUTING_ID, b"\x00zq-local" + serial.to_bytes(8, "big"))
                sock.connect(d.endpoint)
                sock.send(wire.encode(wire.Bye()))
                sock.send(wire.encode(wire.Unsubscribe(1, "0")))
                time.sleep(0.1)
                sock.close(0)
                sock = zmq.Context.instance().socket(zmq.DEALER)
                sock.linger = 0
            sock.close(0)
            assert local_ids and all(i in server.peers for i in local_ids)  # the sessions are untouched
            assert all(len(i) > 255 for i in local_ids)  # no ROUTER routing id is that long
            b = p.publish("jobs", "still mine")
            m = w.get(timeout=5)
            assert m is not None and m.bookmark == b
            m.ack()
    finally:
        d.stop()


# --------------------------------------------------- (3) per-frame key

def test_a_frame_from_another_key_is_not_handled_under_the_session(secured):
    d, keys = secured
    rid = b"victim-routing-id"
    with client(d, keys, "alice") as c:
        c.publish("tenant-a", "alice's secret")
    victim = Raw(d.endpoint, keys, "alice", routing_id=rid)
    assert type(victim.hello("victim")) is wire.Welcome
    assert type(victim.ask(wire.Subscribe(1, "s", "tenant-a", 1, None, False))) is wire.Subscribed
    got = victim.recv()
    assert type(got) is wire.DeliverRecords, got
    bookmark, epoch = got.records[0].seq, got.deliveries[0]
    victim.close()  # its connection drops; the session lives until the dead-peer timeout

    # A key with no rights, on the victim's id. libzmq keeps a connection whose chosen id
    # is still held by one it has not yet seen close unidentified for good (it answers
    # nothing): a persistent attacker connects again until it is heard.
    end = time.monotonic() + 10
    while True:
        attacker = Raw(d.endpoint, keys, "mallory", routing_id=rid)
        try:
            ack = attacker.ask(wire.Ack("s", [bookmark], [epoch], 7), timeout=0.5)
            break
        except TimeoutError:
            attacker.close()
            if time.monotonic() > end:
                raise
    try:
        assert type(ack) is wire.Error and ack.code == wire.NO_SESSION, ack  # type: ignore[attr-defined]
        purge = attacker.ask(wire.Admin(8, "purge", {"queue": "tenant-a"}))
        assert type(purge) is wire.Error and purge.code == wire.NO_SESSION, purge  # type: ignore[attr-defined]
        # Its own session has its own (no) rights.
        assert type(attacker.hello("mallory")) is wire.Welcome
        purge = attacker.ask(wire.Admin(9, "purge", {"queue": "tenant-a"}))
        assert type(purge) is wire.Error and "may not" in purge.message, purge  # type: ignore[attr-defined]
    finally:
        attacker.close()
    with client(d, keys, "alice") as c:
        st = c.stats()
        assert st["server"]["security"]["key_mismatch"] >= 1
        q = st["queues"]["tenant-a"]
        assert q["depth"] == 1 and q["acked"] == 0  # the victim's message was not acked, nor purged
        assert not q["consumers"]  # the victim's session ended at the first foreign frame


# ------------------------------------------------------------- (4) reload

def no_session_soon(raw: Raw, req: int) -> bool:
    answer = raw.ask(wire.Publish(req, "orders", [(b"y", {}, None)]))
    return type(answer) is wire.Error and answer.code == wire.NO_SESSION  # type: ignore[attr-defined]


def test_a_reload_ends_sessions_whose_key_was_removed(secured):
    d, keys = secured
    alice = Raw(d.endpoint, keys, "alice")
    try:
        assert type(alice.hello("alice")) is wire.Welcome
        assert type(alice.ask(wire.Publish(1, "orders", [(b"x", {}, None)]))) is wire.Confirm
        (keys["allowed"] / keys["alice"][0].name).unlink()
        d.server.request_reload()  # type: ignore[union-attr]  (what SIGHUP does)
        reqs = iter(range(2, 1000))
        wait_until(lambda: no_session_soon(alice, next(reqs)), timeout=5, interval=0.1,
                   what="the removed key's session to end")
        refused = alice.hello("alice")  # no new session for a key no longer allowed
        assert type(refused) is wire.Error and "no longer allowed" in refused.message, refused  # type: ignore[attr-defined]
        assert no_session_soon(alice, 1000)
        with client(d, keys, "bob") as c:
            assert c.stats()["server"]["security"]["sessions_ended"] == 1
    finally:
        alice.close()


def test_a_file_in_the_allowlist_that_is_not_a_key_is_skipped_and_the_removals_still_take_effect(secured):
    """pyzmq's own loader gives up on the whole directory at the first bad file and keeps
    the old keys: one half-copied file undid every revocation, silently."""
    d, keys = secured
    alice = Raw(d.endpoint, keys, "alice")
    try:
        assert type(alice.hello("alice")) is wire.Welcome
        (keys["allowed"] / keys["alice"][0].name).unlink()  # revoked ...
        (keys["allowed"] / "half-copied.key").write_text("metadata\ncurve\n    public-key = \"tooshort\"\n")
        (keys["allowed"] / "binary.key").write_bytes(b"\xff\xfe\x00 not a certificate")
        (keys["allowed"] / "overflow.key").write_text("curve\n    public-key = \"" + "#" * 40 + "\"\n")
        os.mkfifo(keys["allowed"] / "fifo.key")  # opened, it would block the loop for good
        (keys["allowed"] / "huge.key").write_bytes(b"#" * (1 << 20))
        (keys["allowed"] / "dangling.key").symlink_to(keys["dir"] / "nowhere")
        d.server.request_reload()  # type: ignore[union-attr]  (what SIGHUP does)
        reqs = iter(range(2, 1000))
        wait_until(lambda: no_session_soon(alice, next(reqs)), timeout=5, interval=0.1,
                   what="the removed key's session to end despite the bad files beside it")
        refused = alice.hello("alice")
        assert type(refused) is wire.Error and "no longer allowed" in refused.message, refused  # type: ignore[attr-defined]
        with client(d, keys, "bob") as c:  # the good files still read
            security = c.stats()["server"]["security"]
            # (>= 1: the heartbeat's own look at the directory may have read it while the files were written)
            assert security["allowlist_errors"] >= 1 and security["allowed_keys"] == 3, security
    finally:
        alice.close()


def test_an_allowlist_directory_that_cannot_be_read_keeps_the_keys_as_they_were(secured):
    d, keys = secured
    moved = keys["dir"] / "allowed-elsewhere"
    keys["allowed"].rename(moved)  # an operator's mistake: the directory is gone
    try:
        d.server.request_reload()  # type: ignore[union-attr]
        with client(d, keys, "bob") as c:  # still allowed: every key stays as it was
            security = c.stats()["server"]["security"]
            # (>= 1: the heartbeat's own look at the directory may have read it first)
            assert security["allowlist_errors"] >= 1 and security["allowed_keys"] == 4, security
    finally:
        moved.rename(keys["allowed"])


def test_the_heartbeat_reads_the_allowlist_again_whatever_else_the_directory_holds(keys):
    """No SIGHUP: the heartbeat's look at the directory ends a removed key's session, with
    a dangling link beside the keys (it once made every look see no change), and an
    allowlist moved away for an empty one revokes every key (it once looked unchanged)."""
    sec = section(keys, bob={"publish": ["*"]})
    d = zq.Dispatcher(Config(data=str(keys["dir"] / "d"), bind=["tcp://127.0.0.1:0"], security=sec,
                             heartbeat_ms=200)).start()
    alice, bob = Raw(d.endpoint, keys, "alice"), Raw(d.endpoint, keys, "bob")
    try:
        (keys["allowed"] / "README").symlink_to(keys["dir"] / "nowhere")
        assert type(alice.hello("alice")) is wire.Welcome and type(bob.hello("bob")) is wire.Welcome
        reqs = iter(range(1, 100_000))  # (a frame every 0.1 s keeps each session inside its dead-peer window)
        (keys["allowed"] / keys["alice"][0].name).unlink()
        wait_until(lambda: no_session_soon(alice, next(reqs)), timeout=10, interval=0.1,
                   what="the heartbeat to end the removed key's session")
        assert not no_session_soon(bob, next(reqs))  # the others stay
        keys["allowed"].rename(keys["dir"] / "allowed-before")
        keys["allowed"].mkdir()  # an empty allowlist: no key is allowed
        wait_until(lambda: no_session_soon(bob, next(reqs)), timeout=10, interval=0.1,
                   what="the empty allowlist to end bob's session too")
    finally:
        alice.close()
        bob.close()
        d.stop()


def test_a_reload_ends_sessions_whose_entitlements_shrank(secured):
    d, keys = secured
    bob = Raw(d.endpoint, keys, "bob")
    try:
        assert type(bob.hello("bob")) is wire.Welcome
        assert type(bob.ask(wire.Publish(1, "orders", [(b"x", {}, None)]))) is wire.Confirm
        server = d.server
        assert server is not None
        server.security.set_rules(section(keys, mallory={k: [] for k in NARROW}, carol=NARROW,  # type: ignore[union-attr]
                                          bob={"publish": ["jobs.*"]}))
        server.request_reload()
        reqs = iter(range(2, 1000))
        wait_until(lambda: no_session_soon(bob, next(reqs)), timeout=5, interval=0.1,
                   what="the narrowed key's session to end")
        assert type(bob.hello("bob")) is wire.Welcome  # still allowed: a new session with the new rights
        err = bob.ask(wire.Publish(4, "orders", [(b"z", {}, None)]))
        assert type(err) is wire.Error and "may not" in err.message, err  # type: ignore[attr-defined]
        assert type(bob.ask(wire.Publish(5, "jobs.x", [(b"z", {}, None)]))) is wire.Confirm
    finally:
        bob.close()


def test_rights_that_grow_keep_the_session(secured):
    d, keys = secured
    carol = Raw(d.endpoint, keys, "carol")
    try:
        assert type(carol.hello("carol")) is wire.Welcome
        wider = dict(NARROW, publish=["carol.*", "shared"])
        d.server.security.set_rules(section(keys, carol=wider))  # type: ignore[union-attr]
        d.server.request_reload()  # type: ignore[union-attr]
        wait_until(lambda: d.server.next_heartbeat_ms > 0 and not d.server.reload_requested, what="the reload")  # type: ignore[union-attr]
        assert type(carol.ask(wire.Publish(1, "shared", [(b"x", {}, None)]))) is wire.Confirm
    finally:
        carol.close()


# ------------------------------------------------------- (5) queue-create

@pytest.mark.parametrize(("settings", "ok"), [
    ({"name": "carol.q1"}, True),
    ({"name": "carol.q2", "topics": r"carol\.in\..*"}, True),
    ({"name": "carol.q3", "topics": r"carol\.exact"}, True),
    ({"name": "carol.q4", "topics": "^.*"}, False),
    ({"name": "carol.q5", "topics": ".*"}, False),
    ({"name": "carol.q6", "topics": "carol.*|B.*"}, False),
    ({"name": "carol.q7", "topics": r"B\..*"}, False),
    ({"name": "carol.q8", "publish_to": "B"}, False),
    ({"name": "carol.q9", "publish_to": "carol.out"}, True),
    ({"name": "carol.q10", "dead_letter": "B.dlq"}, False),
    ({"name": "B.jobs"}, False),
])
def test_queue_settings_are_checked_against_the_creating_keys_rights(secured, settings, ok):
    d, keys = secured
    with client(d, keys, "carol") as c:
        if ok:
            assert c.create_queue(**settings)["name"] == settings["name"]
        else:
            with pytest.raises(NotEntitledError, match="may not"):
                c.create_queue(**settings)
    with client(d, keys, "alice") as c:  # a key with consume ["*"] may give any pattern
        assert c.create_queue(name="all-of-it", topics=".*")["name"] == "all-of-it"


# ------------------------------------ (5b) operator actions reach only the key's queues

OPERATOR = {"publish": ["carol.*"], "consume": ["carol.*"], "browse": ["carol.*"], "claim": [], "admin": ["*"]}


@pytest.mark.parametrize(("op", "args", "ok"), [
    ("purge", {"queue": "B.jobs"}, False),
    ("purge", {"queue": "carol.jobs"}, True),
    ("ack-filter", {"queue": "B.jobs", "filter": "TRUE"}, False),
    ("move", {"queue": "B.jobs", "to": "carol.jobs"}, False),
    ("move", {"queue": "carol.jobs", "to": "B.jobs"}, False),
    ("move", {"queue": "carol.jobs", "to": "carol.other"}, True),
    ("redrive", {"queue": "B.jobs"}, False),
    ("redrive", {"queue": "carol.jobs"}, False),  # (to each dead letter's own topic: needs publish ["*"])
    ("groups", {"queue": "B.jobs"}, False),
    ("groups", {"queue": "carol.jobs"}, True),
    ("explain", {"queue": "B.jobs", "bookmark": 1}, False),
    ("explain", {"queue": "carol.jobs", "bookmark": 1, "topic": "B.jobs", "msg_id": "x"}, False),
    ("queue-delete", {"name": "B.jobs"}, False),
])
def test_operator_actions_are_checked_against_the_keys_queue_rights(keys, op, args, ok):
    """A key allowed every operation by name (admin ["*"]) but only carol.* queues may
    not purge, move, read or delete another tenant's."""
    sec = section(keys, carol=OPERATOR)
    d = zq.Dispatcher(Config(data=str(keys["dir"] / "d"), bind=["tcp://127.0.0.1:0"], security=sec,
                             heartbeat_ms=5000)).start()
    try:
        with client(d, keys, "alice") as a, client(d, keys, "carol") as c:
            for name in ("B.jobs", "carol.jobs", "carol.other"):
                a.create_queue(name=name)
            a.publish("B.jobs", "tenant B's", headers={"group": "g"})
            if ok:
                c.admin(op, **args)
            else:
                with pytest.raises(NotEntitledError, match="may not|needs publish"):
                    c.admin(op, **args)
                assert a.admin("purge", queue="B.jobs", filter="FALSE") == 0  # alice's own still work
                assert {q["name"] for q in a.queues()} >= {"B.jobs"}
                assert a.stats()["queues"]["B.jobs"]["depth"] == 1  # nothing of B's was touched
    finally:
        d.stop()


# --------------------------------------------------- (6) what a key is shown

def test_stats_and_queues_show_a_key_only_what_it_may_see(secured):
    d, keys = secured
    with client(d, keys, "alice") as a, client(d, keys, "carol") as c:
        a.create_queue(name="B.jobs")
        a.publish("B.jobs", "tenant B")
        c.create_queue(name="carol.jobs")
        with a.subscribe("B.jobs"):
            seen_by_carol = c.stats()
            seen_by_alice = a.stats()
        assert "B.jobs" in seen_by_alice["queues"] and "carol.jobs" in seen_by_alice["queues"]
        assert set(seen_by_carol["queues"]) == {"carol.jobs"}
        assert len(seen_by_carol["peers"]) == 1  # its own session only (no admin right on stats)
        assert len(seen_by_alice["peers"]) >= 2  # default rights: admin ["*"], stats included
        assert [q["name"] for q in c.queues()] == ["carol.jobs"]
        assert {"B.jobs", "carol.jobs"} <= {q["name"] for q in a.queues()}


def test_rights_helpers():
    narrow = Rights(**NARROW)
    assert Rights().covers(narrow) and not narrow.covers(Rights())
    assert narrow.covers(Rights(publish=["carol.*"], consume=[], browse=[], claim=[], admin=[]))


def test_sighup_reads_the_entitlements_from_the_config_file_again(keys):
    """`zq serve -c FILE`: a SIGHUP after the file narrowed a key's rights ends that key's
    sessions, and its next session has the narrower rights; a file that no longer reads
    changes nothing (logged)."""
    import os
    import signal

    cfg = keys["dir"] / "zq.toml"

    def write(bob_publish: list[str]) -> None:
        cfg.write_text(f'[security]\nsecret_key = "{keys["server"][1]}"\nallow = "{keys["allowed"]}"\n\n'
                       f'[[security.client]]\nkey = "{keys["bob"][0]}"\npublish = {json.dumps(bob_publish)}\n'
                       'consume = ["*"]\nbrowse = ["*"]\nadmin = ["stats"]\n')

    write(["*"])
    endpoint = f"ipc://{keys['dir']}/zq.sock"
    proc = subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--config", str(cfg), "--data",
                             str(keys["dir"] / "journal"), "--bind", endpoint], env=env(), stderr=subprocess.PIPE,
                            text=True)
    try:
        with zq.connect(endpoint, key=str(keys["bob"][1]), server_key=str(keys["server"][0]),
                        connect_timeout=20) as c:  # (a timeout given: waits for it to start)
            assert c.publish("jobs", b"first") > 0
            cfg.write_text("not toml at all [")  # a broken file: the rules stay
            os.kill(proc.pid, signal.SIGHUP)
            # (a publish answered does not mean the signal was handled: wait for the loop to say so,
            # or the rewrite below can land first and both signals read the good file)
            wait_until(lambda: c.stats()["server"]["security"]["reload_failed"] >= 1, timeout=20, interval=0.05,
                       what="the SIGHUP with a broken file counted as a failed reload")
            assert c.stats()["server"]["security"]["reloads"] == 1
            assert c.publish("jobs", b"second", timeout=10) > 0
            cfg.write_bytes(b"# caf\xc3")  # cut in mid-character (not UTF-8): once a crash of the dispatcher
            os.kill(proc.pid, signal.SIGHUP)
            wait_until(lambda: c.stats()["server"]["security"]["reload_failed"] >= 2, timeout=20, interval=0.05,
                       what="the SIGHUP with a file that is not UTF-8 counted as a failed reload")
            assert c.publish("jobs", b"still served", timeout=10) > 0
            write(["other.*"])
            os.kill(proc.pid, signal.SIGHUP)
            def narrowed() -> bool:
                try:
                    c.publish("jobs", b"third", timeout=10)
                except NotEntitledError:
                    return True
                except ConnectionLost:  # (the reload ended the session under this request)
                    pass
                return False

            wait_until(narrowed, timeout=20, interval=0.1, what="bob's publish to jobs refused after the reload")
            security = c.stats()["server"]["security"]
            assert security["sessions_ended"] >= 1 and security["reloads"] == 3 and security["reload_failed"] == 2
            assert c.publish("other.x", b"fine", timeout=10) > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and err.count("the entitlements stay as they were") == 2, err[-2000:]
    assert "cannot be read" in err, err[-2000:]  # the second failure names its cause


# ------------------------------------------------------------ (7) quotas per key

def test_one_key_holds_only_its_share_of_sessions_subscriptions_and_queues(keys):
    """Per-key quotas (#32 §3): a key within its rights cannot take every session,
    subscription or new queue from the other keys; what it is refused is not applied."""
    sec = section(keys, carol={"max_sessions": 2, "max_subscriptions": 3, "max_queues": 3})
    d = zq.Dispatcher(Config(data=str(keys["dir"] / "d"), bind=["tcp://127.0.0.1:0"], security=sec,
                             heartbeat_ms=5000)).start()
    raws: list[Raw] = []
    try:
        for _ in range(2):
            raws.append(Raw(d.endpoint, keys, "carol"))
            assert type(raws[-1].hello()) is wire.Welcome
        third = Raw(d.endpoint, keys, "carol")
        raws.append(third)
        refused = third.hello()
        assert type(refused) is wire.Error and refused.code == "limit" and "max_sessions" in refused.message
        with client(d, keys, "alice") as a:  # another key is not held up
            assert a.stats()["server"]["security"]["quotas"]["refused"] == 1
            first, second = raws[0], raws[1]
            for i, r in enumerate((first, first, second)):  # (the first creates carol.jobs: 1 of 3 queues)
                got = r.ask(wire.Subscribe(10 + i, f"s{i}", "carol.jobs", 1))
                assert type(got) is wire.Subscribed, got
            over = second.ask(wire.Subscribe(20, "s9", "carol.jobs", 1))
            assert type(over) is wire.Error and over.code == "limit" and "max_subscriptions" in over.message
            with a.subscribe("carol.jobs"):
                pass
            for topic in ("carol.a", "carol.b"):
                assert type(first.ask(wire.Publish(30, topic, [(b"x", {}, None)]))) is wire.Confirm
            over = first.ask(wire.Publish(31, "carol.c", [(b"lost?", {}, None)]))
            assert type(over) is wire.Error and over.code == "limit" and "max_queues" in over.message
            assert "carol.c" not in a.stats()["queues"]  # refused before anything was stored
            assert type(first.ask(wire.Publish(32, "carol.a", [(b"y", {}, None)]))) is wire.Confirm  # its own: fine
            assert type(first.ask(wire.Unsubscribe(35, "s0"))) is wire.Reply  # room for one subscription
            over = first.ask(wire.Subscribe(34, "s8", "carol.new", 1))  # (a subscription creates its queue)
            assert type(over) is wire.Error and over.code == "limit" and "max_queues" in over.message
            over = first.ask(wire.Admin(33, "queue-create", {"name": "carol.d"}))
            assert type(over) is wire.Error and over.code == "limit"
            assert a.publish("alice.new", b"fine") > 0  # another key still makes new topics
            first.send(wire.Bye())
            wait_until(lambda: len(a.stats()["peers"]) == 2, what="carol's first session gone")
            assert type(third.hello()) is wire.Welcome  # a session freed: room again
    finally:
        for r in raws:
            r.close()
        d.stop()


@pytest.mark.parametrize("bad", ["0", "-1", "2000000", "18446744073709551616", '"10"', "1.5", "true"])
@pytest.mark.parametrize("quota", ["max_sessions", "max_subscriptions", "max_queues"])
def test_quota_settings_are_checked(keys, quota, bad):
    import tomllib

    from zq.core.errors import ConfigError

    text = (f'[security]\nsecret_key = "{keys["server"][1]}"\nallow = "{keys["allowed"]}"\n'
            f'[security.default]\n{quota} = {bad}\n')
    with pytest.raises(ConfigError, match=quota if bad in ("0", "-1", "2000000") else "."):
        Config.from_dict(tomllib.loads(text))
    ok = Config.from_dict(tomllib.loads(text.replace(f"{quota} = {bad}", f"{quota} = 5")))
    assert getattr(ok.security.default, quota) == 5  # type: ignore[union-attr]


def test_an_in_process_session_never_takes_a_remote_keys_rights(secured):
    """With [security], the host's own in-process clients carry no key and are not
    narrowed: once an in-process HELLO took the rights of the last remote HELLO (a
    narrow key's): harmless while nothing in-process read them, wrong all the same."""
    d, keys = secured
    carol = Raw(d.endpoint, keys, "carol")
    try:
        assert type(carol.hello()) is wire.Welcome  # the last remote HELLO: a narrow key's
        with zq.Worker(d, "B.jobs", max_backlog=1) as w, zq.Publisher(d) as p:
            server = d.server
            assert server is not None and server.links
            for link_id in server.links:
                assert server.peers[link_id].rights is None and server.peers[link_id].key is None
            p.publish("B.jobs", "the host's own")
            m = w.get(timeout=5)
            assert m is not None
            m.ack()
    finally:
        carol.close()
