"""Message deadlines end to end (real sockets, a real journal): every client's ``ttl`` /
``expires_at``, the dead letter, bad values on the wire and in the clients, the CLI's
``--ttl``, and a deadline kept across a SIGKILLed dispatcher."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import zq
from zq import wire
from zq.core.settings import QueueSettings
from zq.server.config import Config

from .support import ServerProcess, env, raw_dealer, wait_until
from .test_fencing import frames_until


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def dispatcher(tmp_path):
    queues = [QueueSettings(name="jobs", dead_letter="jobs.dead")]
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], queues=queues)).start()
    yield d
    d.stop()


def test_messages_nobody_took_by_their_deadline_are_dead_lettered_from_every_client(dispatcher):
    with zq.connect(dispatcher.endpoint) as c, zq.Publisher(dispatcher.endpoint) as p:
        t0 = now_ms()
        doomed = [c.publish("jobs", b"client", ttl=0.3), p.publish("jobs", b"publisher", ttl=0.3),
                  c.publish("jobs", b"absolute", expires_at=(t0 + 300) / 1000)]
        doomed += c.publish_many("jobs", [b"m1", b"m2"], ttl=0.3)
        kept = c.publish("jobs", b"kept", ttl=3600)
        explained = c.explain("jobs", doomed[0])
        assert explained["state"] == "waiting" and explained["expires_at_ms"] >= t0 + 300
        with c.subscribe("jobs.dead", max_backlog=10) as dead:
            letters = [dead.get(10) for _ in doomed]
            assert now_ms() - t0 >= 300
            assert sorted(int(m.headers["zq.bookmark"]) for m in letters) == sorted(doomed)
            assert {m.headers["zq.reason"] for m in letters} == {"ttl"}
            assert not any("zq.expires_at" in m.headers for m in letters)  # a dead letter has no deadline
            for m in letters:
                m.ack()
        stats = c.stats()["queues"]["jobs"]
        assert stats["ttl_expired"] == len(doomed) and stats["with_deadline"] == 1
        with c.subscribe("jobs") as sub:
            m = sub.get(5)
            assert m.bookmark == kept and int(m.headers["zq.expires_at"]) >= t0 + 3_600_000  # a consumer sees it
            m.ack()


def test_bad_deadlines_get_clear_answers_in_the_clients(dispatcher):
    with zq.connect(dispatcher.endpoint) as c, zq.Publisher(dispatcher.endpoint) as p:
        for bad, kind in ((-1, ValueError), (0, ValueError), (float("inf"), ValueError), ("5s", TypeError),
                          (10**12, ValueError)):
            with pytest.raises(kind, match="ttl"):
                c.publish("jobs", b"x", ttl=bad)
            with pytest.raises(kind, match="ttl"):
                p.publish("jobs", b"x", ttl=bad)
        for bad, kind in ((True, TypeError), (-5, ValueError), (1e15, ValueError), ("soon", TypeError)):
            with pytest.raises(kind, match="expires_at"):
                c.publish("jobs", b"x", expires_at=bad)
        assert c.publish("jobs", b"fine", ttl=60) > 0


def test_bad_deadlines_on_the_wire_get_clear_answers_and_the_dispatcher_goes_on(dispatcher):
    raw = raw_dealer(dispatcher.endpoint)
    try:
        raw.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "raw")))
        for ttl, expires_at in ((-5, 0), (2**62, 0), (0, -1), (0, 2**63 - 1)):
            raw.send(wire.encode(wire.Publish(1, "jobs", [(b"x", {}, None)], 0, 0, ttl, expires_at)))
            err = frames_until(raw, wire.Error)
            assert err.code == "protocol" and ("ttl" in err.message or "deadline" in err.message), err
        raw.send(wire.encode(wire.Publish(2, "jobs", [(b"x", {"zq.expires_at": "1"}, None)])))
        assert frames_until(raw, wire.Error).code == "protocol"  # the header is the dispatcher's to write
        raw.send(b"\x97\xa3pub\x03\xa4jobs\x91\x93\xc4\x01x\x80\xc0\x00\x00\xa3bad")  # a ttl of the wrong type
        assert frames_until(raw, wire.Error).code == "protocol"
        raw.send(wire.encode(wire.Publish(4, "jobs", [(b"x", {}, None)], 0, 0, 60_000)))
        assert len(frames_until(raw, wire.Confirm).bookmarks) == 1  # still serving
    finally:
        raw.close(0)


def test_the_cli_publishes_with_a_ttl_and_refuses_a_bad_one(dispatcher):
    cli = [sys.executable, "-m", "zq.cli"]
    out = subprocess.run(cli + ["publish", "jobs", "hello", "--ttl", "1h", "-e", dispatcher.endpoint],
                         env=env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    with zq.connect(dispatcher.endpoint) as c:
        assert c.explain("jobs", int(out.stdout))["expires_at_ms"] > now_ms() + 3_500_000
    for bad, said in (("soon", "not a duration"), ("0s", "--ttl must be more than 0")):
        out = subprocess.run(cli + ["publish", "jobs", "x", "--ttl", bad, "-e", dispatcher.endpoint],
                             env=env(), capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and said in out.stderr, out.stderr


def test_deadlines_survive_a_sigkilled_dispatcher(tmp_path):
    """The deadline is journaled with the message: after SIGKILL and a restart one that
    passed meanwhile expires at once, and one still ahead keeps its time."""
    cfg = tmp_path / "zq.toml"
    cfg.write_text('[[queue]]\nname = "jobs"\ndead_letter = "jobs.dead"\n')
    server = ServerProcess(tmp_path, config=cfg).start()
    try:
        with zq.connect(server.endpoint) as c:
            soon = c.publish("jobs", b"soon", ttl=0.5)
            later = c.publish("jobs", b"later", ttl=3600)
            passes, ahead = (c.explain("jobs", s)["expires_at_ms"] for s in (soon, later))
        server.kill()
        time.sleep(max(0.0, (passes - now_ms()) / 1000))  # the deadline passes while the dispatcher is down
        server.start()
        with zq.connect(server.endpoint) as c:
            with c.subscribe("jobs.dead") as dead:
                letter = dead.get(10)
                assert letter is not None and letter.headers["zq.bookmark"] == str(soon)
                assert letter.headers["zq.reason"] == "ttl"
                letter.ack()
            assert c.explain("jobs", later)["expires_at_ms"] == ahead
            wait_until(lambda: c.stats()["queues"]["jobs"]["ttl_expired"] == 1, timeout=10, what="counted")
    finally:
        assert "Traceback" not in server.terminate()
