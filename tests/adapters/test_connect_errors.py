"""A connect that cannot succeed says why, at once, over real sockets: nothing listening
(refused: well under a second, from the CLI and from Python), and each way a secured
`zq serve` refuses a handshake (an unknown key, the wrong server key, plaintext; and keys
given to a plaintext dispatcher). A worker that waits for its dispatcher says why once;
a client that was served waits for a dispatcher that restarts; a frame with no session
is answered in plain words."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time

import pytest
import typer
import zmq

import zq
from zq import wire
from zq.cli.common import client_for
from zq.client import ConnectionLost
from zq.client.publisher import Publisher
from zq.client.session import HandshakeRefused, NotListening
from zq.client.worker import Worker
from zq.keys import keygen

from .support import ServerProcess, env, raw_dealer, wait_until

FAST_S = 1.5  # "well under a second" for a refused connection, with room for a loaded 2-core machine
SECURITY_S = 5.0  # a refused handshake: at once, not after the connect timeout (30 s below)

CONFIG = """
[security]
secret_key = "keys/server.key_secret"
allow = "allowed"
"""


def free_tcp_endpoint() -> str:
    """A loopback port nothing listens on (bound, then closed: the kernel refuses it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def timed(make):  # type: ignore[no-untyped-def]
    """The exception ``make()`` raises, and how long it took to."""
    started = time.monotonic()
    with pytest.raises(ConnectionLost) as info:
        make().close()
    return info.value, time.monotonic() - started


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    root = tmp_path_factory.mktemp("refusals")
    keys, allowed = root / "keys", root / "allowed"
    allowed.mkdir()
    paths = {name: keygen(str(keys), name) for name in ("server", "alice", "mallory", "impostor")}
    (allowed / "alice.key").write_bytes((keys / "alice.key").read_bytes())
    (root / "zq.toml").write_text(CONFIG)
    server = ServerProcess(root, config=root / "zq.toml")
    server.proc = subprocess.Popen(
        [sys.executable, "-m", "zq.cli", "serve", "--data", str(root / "journal"), "--bind", server.endpoint,
         "--config", str(root / "zq.toml")], env=env(), stderr=subprocess.PIPE, text=True, cwd=root)
    try:
        zq.connect(server.endpoint, key=paths["alice"][1], server_key=paths["server"][0], connect_timeout=30).close()
        yield server, paths
    finally:
        err = server.terminate()
    assert "Traceback" not in err, err[-3000:]


def creds(paths, key: str, server_key: str = "server") -> dict:  # type: ignore[no-untyped-def]
    return {"key": paths[key][1], "server_key": paths[server_key][0]}


# ------------------------------------------------------------------ nothing listening


@pytest.mark.parametrize("where", ["tcp", "ipc"])
def test_a_client_with_nothing_listening_fails_well_under_a_second(where, tmp_path):
    ep = free_tcp_endpoint() if where == "tcp" else f"ipc://{tmp_path}/nobody.sock"
    for make in (lambda: zq.Client(ep), lambda: Publisher(ep), lambda: Worker(ep, "jobs", wait_for_dispatcher=False)):
        exc, took = timed(make)
        assert isinstance(exc, NotListening) and took < FAST_S, (took, exc)
        assert str(exc) == f"nothing is listening at {ep} (connection refused)"


def test_the_cli_with_nothing_listening_fails_well_under_a_second_in_one_line(capsys):
    ep = free_tcp_endpoint()
    started = time.monotonic()
    with pytest.raises(typer.Exit) as info:
        client_for(ep)  # what every client command calls (connect timeout 5 s)
    assert time.monotonic() - started < FAST_S and info.value.exit_code == 3
    assert capsys.readouterr().err == (f"zq: nothing is listening at {ep} (connection refused): "
                                       "is `zq serve` running? set --endpoint or ZQ_ENDPOINT\n")
    run = subprocess.run([sys.executable, "-m", "zq.cli", "stats", "-e", ep], env=env(), capture_output=True,
                         text=True, timeout=60)
    lines = [line for line in run.stderr.splitlines() if "compiled" not in line]  # (a stale build's note)
    assert run.returncode == 3 and lines == [f"zq: nothing is listening at {ep} (connection refused): "
                                             "is `zq serve` running? set --endpoint or ZQ_ENDPOINT"], run.stderr


def test_a_connect_timeout_given_waits_for_a_dispatcher_and_says_why_it_gave_up():
    ep = free_tcp_endpoint()
    exc, took = timed(lambda: zq.Client(ep, connect_timeout=1.0))
    assert 1.0 <= took < 1.0 + FAST_S and type(exc) is ConnectionLost
    assert str(exc) == f"no answer from a zq dispatcher at {ep} within 1.0s (connection refused: nothing is listening there)"


def test_a_worker_that_never_connects_says_why_once(caplog):
    ep = free_tcp_endpoint()
    caplog.set_level(logging.DEBUG, logger="zq.worker")
    started = time.monotonic()
    with pytest.raises(ConnectionLost, match="connection refused: nothing is listening there"):
        Worker(ep, "jobs", connect_timeout=3.5, liveness=1)  # a 1 s dead-peer window: three tries
    assert time.monotonic() - started >= 3.5
    said = [r for r in caplog.records if r.name == "zq.worker" and r.levelno >= logging.INFO]
    assert [r.getMessage() for r in said] == [
        f"no zq dispatcher at {ep} yet (connection refused: nothing is listening there): still trying"]
    assert sum("still no zq dispatcher" in r.getMessage() for r in caplog.records) >= 2  # the tries after it: debug


def test_a_client_and_a_worker_that_were_served_wait_for_a_dispatcher_that_restarts(tmp_path, caplog):
    server = ServerProcess(tmp_path).start()
    caplog.set_level(logging.WARNING)
    try:
        with zq.Client(server.endpoint) as c, Worker(server.endpoint, "jobs") as w:
            assert c.publish("jobs", "before") > 0
            assert w.get(timeout=10).data == b"before"
            server.kill()
            server.start()  # refused meanwhile: both go on trying
            assert c.publish("jobs", "after", timeout=30) > 0
            msg = wait_until(lambda: w.get(timeout=0.5), timeout=30, what="the worker to be served again")
            assert msg.data in (b"before", b"after")
    finally:
        server.terminate()
    worker_lines = [r.getMessage() for r in caplog.records if r.name == "zq.worker"]
    assert len(worker_lines) <= 3, worker_lines  # the drop, and at most a refusal or a silence: once each


# ------------------------------------------------------------------ refused handshakes


@pytest.mark.parametrize("client", ["client", "publisher", "worker"])
def test_an_unknown_key_is_named(secured, client):
    server, paths = secured
    make = {"client": zq.connect, "publisher": Publisher,
            "worker": lambda ep, **kw: Worker(ep, "jobs", **kw)}[client]
    exc, took = timed(lambda: make(server.endpoint, connect_timeout=30, **creds(paths, "mallory")))
    assert isinstance(exc, HandshakeRefused) and took < SECURITY_S, (took, exc)
    assert str(exc) == f"{server.endpoint}: the dispatcher refused this client's key (not in its allowlist)"


def test_a_wrong_server_key_is_named(secured):
    server, paths = secured
    exc, took = timed(lambda: zq.connect(server.endpoint, connect_timeout=30, **creds(paths, "alice", "impostor")))
    assert isinstance(exc, HandshakeRefused) and took < SECURITY_S, (took, exc)
    assert str(exc) == f"{server.endpoint}: the dispatcher's key is not the one given (server_key mismatch)"


def test_a_plaintext_client_of_a_secured_dispatcher_is_told_it_needs_keys(secured, monkeypatch):
    server, _ = secured
    monkeypatch.delenv("ZQ_KEY", raising=False)
    monkeypatch.delenv("ZQ_SERVER_KEY", raising=False)
    for make in (lambda: zq.connect(server.endpoint, connect_timeout=30), lambda: Worker(server.endpoint, "jobs")):
        exc, took = timed(make)
        assert isinstance(exc, HandshakeRefused) and took < SECURITY_S, (took, exc)
        assert "the dispatcher requires CurveZMQ security; this client connected in plaintext" in str(exc)


def test_keys_given_to_a_plaintext_dispatcher_are_named(secured):
    _, paths = secured
    plain = zmq.Context.instance().socket(zmq.ROUTER)  # any plaintext ZMTP peer: the handshake is libzmq's
    plain.setsockopt(zmq.LINGER, 0)
    try:
        port = plain.bind_to_random_port("tcp://127.0.0.1")
        ep = f"tcp://127.0.0.1:{port}"
        exc, took = timed(lambda: zq.connect(ep, connect_timeout=30, **creds(paths, "alice")))
    finally:
        plain.close(0)
    assert isinstance(exc, HandshakeRefused) and took < SECURITY_S, (took, exc)
    assert "the dispatcher does not use CurveZMQ security; this client was given keys" in str(exc)


def test_the_cli_names_a_refused_key_and_where_keys_are_given(secured):
    server, paths = secured
    run = subprocess.run([sys.executable, "-m", "zq.cli", "--key", paths["mallory"][1], "--server-key",
                          paths["server"][0], "stats", "-e", server.endpoint], env=env(), capture_output=True,
                         text=True, timeout=60)
    lines = [line for line in run.stderr.splitlines() if "compiled" not in line]
    assert run.returncode == 3 and lines == [
        f"zq: {server.endpoint}: the dispatcher refused this client's key (not in its allowlist) "
        "(keys: --key and --server-key, or ZQ_KEY and ZQ_SERVER_KEY)"], run.stderr


# ------------------------------------------------------------------ no session


def test_a_frame_without_a_session_is_answered_in_plain_words(tmp_path):
    server = ServerProcess(tmp_path).start()
    try:
        raw = raw_dealer(server.endpoint)
        raw.send(wire.encode(wire.Stats(7)))  # no HELLO: as after a timed-out session, or a restart
        answer = [wire.server_decoder.decode(raw.recv())]  # (raw_dealer: a bounded receive)
        raw.close(0)
    finally:
        server.terminate()
    assert [(type(a), a.code, a.message) for a in answer] == [(wire.Error, wire.NO_SESSION, (
        "this connection has no session (it timed out, or the dispatcher restarted): the client reconnects by itself"))]
