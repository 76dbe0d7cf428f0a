"""A publisher whose confirmations are held is told, after a second, what they wait for
(a NOTICE): the standbys of ``replicas_ack`` (how many, and which are connected, or
none), or a flow-control queue over its limits (named). Once per reason every few
seconds while it lasts, only to sessions whose HELLO accepts it (an older client never
gets a frame it cannot read), never when nothing is held, never to a publisher that
left. Real sockets: an embedded dispatcher, raw DEALERs, and `zq serve` / `zq publish`
in their own processes."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import select
import subprocess
import sys
import time

import pytest
import zmq

import zq
import zq.aio
from zq import wire
from zq.core.settings import QueueSettings
from zq.server.config import Config
from zq.server.held import NOTICE_AFTER_MS, NOTICE_EVERY_MS

from .support import ROOT, ServerProcess, env, frames_for, wait_until

NO_STANDBY = "waiting for 1 standby to have it on disk (replicas_ack = 1); none is connected"
FULL_JOBS = ("queue 'jobs' is over its limits (3 messages of max_depth 2; overflow = flow-control): confirmed once "
             "consumers drain it below 90% of them")


def replicated_dispatcher(tmp_path) -> zq.Dispatcher:  # type: ignore[no-untyped-def]
    cfg = Config.from_dict({"cluster": {"replicas_ack": 1, "standby_secret": secrets.token_hex(16)}})
    cfg.data, cfg.bind = str(tmp_path / "d"), ["tcp://127.0.0.1:0"]
    return zq.Dispatcher(cfg).start()


def flow_dispatcher(tmp_path) -> zq.Dispatcher:  # type: ignore[no-untyped-def]
    return zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"],
                                queues=[QueueSettings(name="jobs", max_depth=2, overflow="flow-control")])).start()


def noticing_session(endpoint: str, name: str = "raw", accepts: tuple[str, ...] = (wire.NOTICE,)) -> zmq.Socket:
    """A bare DEALER whose HELLO accepts NOTICE (as zq's clients' do), welcomed."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, name, list(accepts))))
    assert sock.poll(10_000), "no WELCOME"
    assert type(wire.server_decoder.decode(sock.recv())) is wire.Welcome
    return sock


def publish(sock: zmq.Socket, req: int, topic: str = "jobs") -> None:
    sock.send(wire.encode(wire.Publish(req, topic, [(b"m%d" % req, {}, None)])))


def listen(sock: zmq.Socket, seconds: float) -> list[object]:
    """Every frame ``sock`` receives in the next ``seconds``, decoded, saying HEARTBEAT
    as a client does (a silent peer's session ends after heartbeat x liveness: 3 s)."""
    out: list[object] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.send(wire.HEARTBEAT_FRAME)
        out += frames_for(sock, min(left, 0.5))
    return out


def of(frames: list, kind: type) -> list:
    return [f for f in frames if type(f) is kind]


def notices_in(caplog, logger: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.getMessage() for r in caplog.records if r.name == logger and "not confirmed yet" in r.getMessage()]


def test_replicas_ack_without_a_standby_the_clients_are_told_within_two_seconds(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    d = replicated_dispatcher(tmp_path)
    try:
        with zq.connect(d.endpoint) as c:
            started = time.monotonic()
            waiting = c.publish_async("jobs", b"waits for a standby")
            wait_until(lambda: notices_in(caplog, "zq.client"), timeout=2.5, what="the client's notice")
            assert time.monotonic() - started >= NOTICE_AFTER_MS / 1000 - 0.05  # (not before the second)
            said = notices_in(caplog, "zq.client")
            assert len(said) == 1 and said[0].endswith(f"s): {NO_STANDBY}"), said
            assert said[0].startswith("publish not confirmed yet (1 frame waiting "), said
            assert not waiting.done()  # nothing confirmed: still waiting
            assert c.stats()["server"]["replication"]["held_confirmations"] == 1
        with zq.Publisher(d.endpoint) as p:  # the single-threaded publisher, over the socket
            with pytest.raises(zq.ConnectionLost, match="not confirmed within"):
                p.publish("jobs", b"waits too", timeout=2.5)
        said = notices_in(caplog, "zq.publisher")
        assert len(said) == 1 and said[0].endswith(NO_STANDBY), said
        with zq.Publisher(d) as p:  # ... and in-process (the direct path): the loop's notice reaches it
            caplog.clear()
            with pytest.raises(zq.ConnectionLost):
                p.publish("jobs", b"in-process", timeout=2.5)
        assert [m for m in notices_in(caplog, "zq.publisher") if m.endswith(NO_STANDBY)], caplog.text

        async def asyncio_client() -> None:
            async with zq.aio.connect(d.endpoint) as ac:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(ac.publish("jobs", b"async"), 2.5)

        caplog.clear()
        asyncio.run(asyncio_client())
        assert [m for m in notices_in(caplog, "zq.client") if m.endswith(NO_STANDBY)], caplog.text
        assert d.server is not None and d.server.internal_errors == 0
    finally:
        d.stop()


def test_the_notice_frame_says_who_waits_how_long_and_comes_again_every_few_seconds(tmp_path):
    d = replicated_dispatcher(tmp_path)
    try:
        sock = noticing_session(d.endpoint)
        publish(sock, 1)
        publish(sock, 2)
        first = of(listen(sock, NOTICE_AFTER_MS / 1000 + 1), wire.Notice)
        assert len(first) == 1, first
        n = first[0]
        assert (n.code, n.message, n.held, n.queue) == (wire.NOTICE_REPLICAS, NO_STANDBY, 2, "")
        assert NOTICE_AFTER_MS <= n.waited_ms < NOTICE_AFTER_MS + 1000
        again = of(listen(sock, NOTICE_EVERY_MS / 1000 + 0.5), wire.Notice)  # once per reason, every few seconds
        assert len(again) == 1 and again[0].waited_ms >= n.waited_ms + NOTICE_EVERY_MS - 1200, again
        old = noticing_session(d.endpoint, "an older client", accepts=())  # its HELLO does not accept NOTICE
        publish(old, 1)
        frames = listen(old, NOTICE_AFTER_MS / 1000 + 1)
        assert not of(frames, wire.Notice) and not of(frames, wire.Confirm), frames  # waits, told nothing
        sock.close(0)
        old.close(0)
    finally:
        d.stop()


def test_a_standby_that_is_connected_is_named(tmp_path):
    """A standby that reported a position, behind the held publish: named, how far behind."""
    secret = secrets.token_hex(16)
    cfg = Config.from_dict({"cluster": {"replicas_ack": 2, "standby_secret": secret}})
    cfg.data, cfg.bind = str(tmp_path / "d"), ["tcp://127.0.0.1:0"]
    d = zq.Dispatcher(cfg).start()
    try:
        standby = noticing_session(d.endpoint, "zq standby b", accepts=())
        standby.send(wire.encode(wire.Bounds(1, None, position=0, proof=secret)))
        assert of(frames_for(standby, 0.3), wire.Reply)
        sock = noticing_session(d.endpoint)
        publish(sock, 1)
        got = of(listen(sock, NOTICE_AFTER_MS / 1000 + 1), wire.Notice)
        assert len(got) == 1, got
        assert re.fullmatch(r"waiting for 2 standbys to have it on disk \(replicas_ack = 2\); only 1 is connected: "
                            r"'zq standby b' \(\d+ records? behind\)", got[0].message), got[0].message
        sock.close(0)
        standby.close(0)
    finally:
        d.stop()


def test_a_flow_control_queue_over_its_limit_is_named(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    d = flow_dispatcher(tmp_path)
    try:
        sock = noticing_session(d.endpoint)
        for req in (1, 2, 3):
            publish(sock, req)
        frames = listen(sock, NOTICE_AFTER_MS / 1000 + 1)
        assert len(of(frames, wire.Confirm)) == 2  # the third went over: held
        notices = of(frames, wire.Notice)
        assert [(n.code, n.queue, n.held, n.message) for n in notices] == [(wire.NOTICE_FLOW, "jobs", 1, FULL_JOBS)]
        with zq.connect(d.endpoint) as c:
            waiting = c.publish_async("jobs", b"a fourth")
            wait_until(lambda: notices_in(caplog, "zq.client"), timeout=2.5, what="the client's notice")
            said = notices_in(caplog, "zq.client")
            assert len(said) == 1 and "queue 'jobs' is over its limits (4 messages of max_depth 2" in said[0], said
            assert not waiting.done()
            sock.send(wire.HEARTBEAT_FRAME)  # (the raw session stays alive meanwhile)
            c.purge("jobs")  # drained: both confirmed, nothing more said
            assert isinstance(waiting.result(10), int) and of(listen(sock, 0.5), wire.Confirm)
        assert not of(listen(sock, NOTICE_AFTER_MS / 1000 + 0.5), wire.Notice)
        sock.close(0)
    finally:
        d.stop()


def test_nothing_held_no_notice_at_all(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"])).start()
    try:
        sock = noticing_session(d.endpoint)
        for req in range(1, 51):
            publish(sock, req)
        frames = listen(sock, NOTICE_AFTER_MS / 1000 + 1.5)
        assert len(of(frames, wire.Confirm)) == 50
        assert {type(f) for f in frames} <= {wire.Confirm, wire.Heartbeat}, frames
        assert d.server is not None and not d.server.confirmations.waits
    finally:
        d.stop()


@pytest.mark.parametrize("leaves", ["bye", "closes"])
def test_a_publisher_that_leaves_while_held_is_told_nothing_after(tmp_path, caplog, leaves):
    caplog.set_level(logging.INFO)
    d = replicated_dispatcher(tmp_path)
    server = d.server
    assert server is not None
    sent: list[bytes] = []
    send = server.send

    def spy(peer_id, frame, counted=False):  # type: ignore[no-untyped-def]
        body = frame if isinstance(frame, bytes) else frame.bytes
        if body[1:8] == b"\xa6notice":
            sent.append(peer_id)
        return send(peer_id, frame, counted)

    server.send = spy  # type: ignore[method-assign]
    try:
        sock = noticing_session(d.endpoint, "leaves")
        publish(sock, 1)
        wait_until(lambda: server.confirmations.waits, timeout=5, what="the publish held")
        if leaves == "bye":
            sock.send(wire.encode(wire.Bye()))
            wait_until(lambda: not server.confirmations.waits, timeout=5, what="its held confirmations gone with it")
        sock.close(0)
        # A connection that closed without BYE: the dispatcher finds it gone at its first
        # send (the notice, or a heartbeat), and drops it; nothing is sent after that.
        wait_until(lambda: not server.confirmations.waits and not server.peers, timeout=5,
                   what="the publisher's session gone")
        after = len(sent)
        end = time.monotonic() + NOTICE_AFTER_MS / 1000 + 1
        while time.monotonic() < end:
            assert len(sent) == after
            time.sleep(0.05)
        if leaves == "bye":
            assert sent == []
        assert server.internal_errors == 0
        assert not [r for r in caplog.records if r.name.startswith("zq.server") and r.levelno >= logging.ERROR]
    finally:
        d.stop()


def test_zq_publish_prints_what_it_waits_for(tmp_path):
    cfg = tmp_path / "zq.toml"
    cfg.write_text(f'[cluster]\nreplicas_ack = 1\nstandby_secret = "{secrets.token_hex(16)}"\n')
    server = ServerProcess(tmp_path, config=cfg).start()
    proc = None
    try:
        proc = subprocess.Popen([sys.executable, "-m", "zq.cli", "publish", "jobs", "hello", "--endpoint",
                                 server.endpoint], env=env(), cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        deadline = time.monotonic() + 30  # (the CLI's start: imports, connect; then the second)
        lines: list[str] = []
        while time.monotonic() < deadline and not any(line.startswith("zq publish:") for line in lines):
            ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                line = proc.stderr.readline()
                if not line:
                    break  # (it exited)
                lines.append(line)
        assert f"zq publish: not confirmed yet: {NO_STANDBY}\n" in lines, lines
        assert proc.poll() is None  # still waiting: nothing confirmed, no bookmark printed
    finally:
        if proc is not None:
            proc.kill()  # its own pid
            out, _ = proc.communicate(timeout=10)
            assert out == ""
        assert "Traceback" not in server.terminate()


def test_a_single_cluster_node_says_it_has_no_standby_and_a_cluster_names_its_in_sync_ones():
    """The issue's case (a lone cluster node with replicas_ack = 1) and a cluster's other
    answers, from the leader's view of its cluster (``Server.replicas_wait`` on a stand-in)."""
    from types import SimpleNamespace

    from zq.server.loop import Server
    from zq.server.sessions import Peer

    def leader(k: int, need: int, isr: set[str], *standbys: Peer) -> str:
        server = SimpleNamespace(engine=SimpleNamespace(next_seq=100), peers={p.peer_id: p for p in standbys},
                                 config=SimpleNamespace(replicas_ack=k),
                                 cluster=SimpleNamespace(isr=isr | {"a"}, node="a", need=need))
        return Server.replicas_wait(server)  # type: ignore[arg-type]

    def standby(node: str, position: int) -> Peer:
        return Peer(node.encode(), f"zq standby {node}", 0, replica_position=position, node=node)

    every = "to have it on disk, and for every in-sync one"
    assert leader(1, 1, set()) == f"waiting for 1 standby {every} (replicas_ack = 1); none is connected"
    assert leader(1, 1, {"b"}, standby("b", 99), standby("c", 40)) == (
        f"waiting for 1 standby {every} (replicas_ack = 1); in sync: 'b' (1 record behind); "
        "connected, not in sync yet: 'c' (60 records behind)")
    assert leader(1, 2, set(), standby("c", 100)) == (
        f"waiting for 2 standbys {every} (replicas_ack = 1, min_insync = 2); in sync: none; "
        "connected, not in sync yet: 'c' (has everything committed)")
    assert leader(0, 0, {"b"}, standby("b", 90)) == (
        "waiting for every in-sync standby to have it on disk before this leader stops (hand-over); "
        "in sync: 'b' (10 records behind)")


def test_what_is_held_is_looked_at_only_when_a_notice_may_be_due():
    """The structure, on its own clock: per publisher and reason, the last progress;
    told after NOTICE_AFTER_MS without one, then every NOTICE_EVERY_MS; forgotten when
    released or when the publisher leaves."""
    from zq.server.held import NEVER, HeldConfirmations

    now = [0]
    h = HeldConfirmations(clock=lambda: now[0])
    assert h.due_notices(10**9) == [] and h.next_notice_ms == NEVER and not h.waits
    h.hold_replicated(b"p", b"c1", needs=1)
    h.hold_replicated(b"p", b"c2", needs=2)
    h.hold_flow(b"q", b"f1", ["a", "b"])
    assert h.next_notice_ms == NOTICE_AFTER_MS
    assert h.due_notices(NOTICE_AFTER_MS - 1) == []
    now[0] = 500
    h.release_replicated(1, lambda p, f: None)  # progress for p: its wait starts again
    due = h.due_notices(NOTICE_AFTER_MS)
    assert [(p, r, w.count) for p, r, w in due] == [(b"q", "a", 1)]
    assert h.next_notice_ms == 500 + NOTICE_AFTER_MS
    assert [(p, r) for p, r, _ in h.due_notices(500 + NOTICE_AFTER_MS)] == [(b"p", None)]
    assert h.due_notices(NOTICE_AFTER_MS + NOTICE_EVERY_MS - 1) == []  # once per reason ...
    assert [(p, r) for p, r, _ in h.due_notices(NOTICE_AFTER_MS + NOTICE_EVERY_MS)] == [(b"q", "a")]  # ... a while
    blocked = {"b"}
    h.release_flow(lambda n: n in blocked, lambda p, f: None)  # a drained, b not: q now waits on b
    assert list(h.waits[b"q"]) == ["b"] and h.waits[b"q"]["b"].count == 1
    h.drop_peer(b"q")
    h.release_replicated(10, lambda p, f: None)
    assert not h.waits and len(h) == 0 and h.flow_count == 0
