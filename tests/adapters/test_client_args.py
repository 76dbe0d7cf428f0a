"""The clients refuse what cannot travel in the caller's thread, at once, with a clear
error; an I/O thread that dies fails every call at once with its cause; and frames
leave in the order the calls were made."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import zq
from zq.client import Client, ConnectionLost
from zq.core.errors import LimitError
from zq.client.publisher import Publisher
from zq.client.worker import Worker

from .support import ServerProcess, env


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("args")).start()
    yield s
    s.terminate()


@pytest.fixture
def client(server):
    with zq.connect(server.endpoint) as c:
        yield c


def quick(fn, *args, **kw):  # type: ignore[no-untyped-def]
    """Call ``fn``; it must raise at once (no 30 s timeout standing in for an error)."""
    started = time.monotonic()
    try:
        fn(*args, **kw)
    finally:
        assert time.monotonic() - started < 5, "the error took a timeout to arrive"


@pytest.mark.parametrize("seconds", [10**19, float("inf"), float("nan"), -1, 0])
def test_extend_beyond_range_is_refused_in_the_callers_thread_and_the_client_goes_on(client, seconds):
    client.publish("ext", "x")
    with client.subscribe("ext") as sub:
        msg = sub.get(10)
        with pytest.raises(ValueError, match="extend"):
            quick(msg.extend, seconds)
        msg.extend(5)
        msg.ack()
    assert client.publish("ext", "after") > 0


@pytest.mark.parametrize(("kw", "error"), [
    ({"lease": 10**19}, ValueError), ({"wait": -1}, ValueError), ({"limit": 10**19}, ValueError),
    ({"lease": "30"}, TypeError), ({"wait": 60.001}, ValueError), ({"wait": 3600}, ValueError),
])
def test_claim_arguments_out_of_range_are_refused_at_once(client, kw, error):
    with pytest.raises(error):
        quick(client.claim, "cq", **kw)
    assert client.claim("cq", wait=0) == []


@pytest.mark.parametrize(("kw", "match"), [
    ({"headers": {"ts": 30}}, "must be str"),
    ({"headers": {1: "x"}}, "must be str"),
    ({"msg_id": 7}, "msg_id"),
    ({"priority": "high"}, "priority"),
])
def test_a_value_of_the_wrong_type_fails_the_call_at_once(client, kw, match):
    with pytest.raises(TypeError, match=match):
        quick(client.publish, "types", "x", **kw)
    if "msg_id" not in kw:
        with pytest.raises(TypeError, match=match):
            quick(client.publish_many, "types", ["x"], **kw)
    assert client.publish("types", "ok") > 0


def test_data_of_the_wrong_type_and_bad_topics_fail_at_once(client):
    with pytest.raises(TypeError, match="bytes or str"):
        quick(client.publish, "types", 42)
    with pytest.raises(zq.ZqError, match="longer than"):
        quick(client.publish, "t" * 481, "x")
    with pytest.raises(zq.ZqError, match="empty"):
        quick(client.publish, "", "x")


def test_a_message_over_the_dispatchers_limit_is_refused_before_it_is_sent(server, client):
    big = b"x" * (16 * 2**20 + 1)
    with pytest.raises(LimitError, match="over the dispatcher's limit"):
        quick(client.publish, "big", big)
    with Publisher(server.endpoint) as p:
        with pytest.raises(LimitError, match="over the dispatcher's limit"):
            quick(p.publish, "big", big)
        assert p.publish("big", b"fits") > 0
    assert client.publish("big", b"fits") > 0


@pytest.mark.parametrize("make", [Client, Publisher, lambda e: Worker(e, "q")])
def test_an_endpoint_without_a_transport_is_one_clear_error(make):
    with pytest.raises(ValueError, match="tcp://127.0.0.1:7780"):
        quick(make, "127.0.0.1:7780")


def test_a_dead_io_thread_fails_waiting_and_later_calls_at_once_with_its_cause(server):
    c = zq.connect(server.endpoint)
    try:
        def broken(*a, **kw):  # type: ignore[no-untyped-def]  # fault injection: a bug in the I/O thread
            raise RuntimeError("planted fault")

        c._send_work = broken  # type: ignore[method-assign]
        with pytest.raises(ConnectionLost, match="planted fault"):
            quick(c.stats, timeout=30)
        with pytest.raises(ConnectionLost, match="planted fault"):
            quick(c.publish, "x", "y")
    finally:
        c.close()


def test_an_ack_then_a_claim_on_one_connection_reach_the_dispatcher_in_that_order(client):
    """A sequenced group's next message is there for a claim made right after the ack
    of its previous one (the ack once left after the claim: 38 misses in 300)."""
    for i in range(150):
        first, second = f"{i}-a".encode(), f"{i}-b".encode()
        client.publish_many("order", [first, second], group=f"g{i}")
        got = client.claim("order", wait=5)
        assert [m.data for m in got] == [first]
        got[0].ack()
        nxt = client.claim("order", wait=0)
        assert [m.data for m in nxt] == [second], f"try {i}: the claim overtook the ack"
        nxt[0].ack()


def test_zq_publish_with_a_line_over_the_limit_fails_at_once_with_one_clear_line(server):
    line = b"x" * (17 * 2**20) + b"\n"
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "zq.cli", "publish", "big", "--endpoint", server.endpoint],
                         input=line, env=env(), capture_output=True, timeout=60)
    assert time.monotonic() - started < 30
    assert out.returncode != 0
    err = out.stderr.decode()
    assert "over the dispatcher's limit" in err and "Traceback" not in err, err[-2000:]


@pytest.mark.parametrize("endpoint", ["tcp://localhost", "tcp://127.0.0.1:7780/", "tcp://127.0.0.1:", "tcp://:7780",
                                      "tcp://127.0.0.1:70000", "tcp://127.0.0.1:0", "tcp://127.0.0.1:7780/x", "ipc://",
                                      "tcp://127.0.0.1:7780,tcp://10.0.0.6"])
@pytest.mark.parametrize("make", [Client, Publisher, lambda e: Worker(e, "q")], ids=["Client", "Publisher", "Worker"])
def test_an_endpoint_without_a_port_or_with_a_path_is_refused_in_the_callers_thread(make, endpoint):
    """They passed the check before and killed the I/O thread with a traceback (issue 32 §4)."""
    import threading

    before = threading.active_count()
    with pytest.raises(ValueError, match="HOST:PORT|no address"):
        quick(make, endpoint)
    assert threading.active_count() == before  # no thread was started, no socket left open


def test_well_formed_endpoints_still_pass_the_check():
    from zq.client.session import check_endpoint

    for ok in ("tcp://127.0.0.1:7780", "tcp://[::1]:7780", "tcp://host-1.example:1", "tcp://eth0;10.0.0.5:7780",
               "ipc:///tmp/zq.sock", "inproc://zq", "tcp://a:1,tcp://b:2"):
        check_endpoint(ok)
