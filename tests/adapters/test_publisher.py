"""zq.Publisher: the single-threaded publisher, against real dispatchers over real sockets."""

from __future__ import annotations

import time

import pytest

import zq
from zq.server.config import Config
from zq.core import QueueSettings

from .support import ServerProcess


@pytest.fixture
def dispatcher(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"])).start()
    yield d
    d.stop()


def test_publishes_are_durable_in_order_and_reach_a_worker(dispatcher):
    with zq.Publisher(dispatcher.endpoint, name="pub") as p:
        one = p.publish("jobs", b"first", group="g1", headers={"k": "v"})
        many = p.publish_many("jobs", [f"m{i}" for i in range(5000)])  # several frames, a window of them in flight
    assert many == list(range(many[0], many[0] + 5000)) and many[0] > one
    with zq.Worker(dispatcher.endpoint, "jobs", max_backlog=256) as w:
        first = w.get(5)
        assert (first.bookmark, first.data, first.group, first.headers["k"]) == (one, b"first", "g1", "v")
        first.ack()
        got = []
        while len(got) < 5000:
            batch = w.get_many(256, timeout=5)
            assert batch, f"stalled after {len(got)}"
            got += [m.bookmark for m in batch]
            w.ack_many(batch)
    assert got == many


def test_errors_are_raised_and_the_session_goes_on(tmp_path):
    cfg = Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], auto_queues=False, max_message_bytes=1024,
                 queues=[QueueSettings(name="jobs")])
    with zq.Dispatcher(cfg) as d, zq.Publisher(d.endpoint) as p:
        with pytest.raises(zq.ProtocolError, match="reserved"):
            p.publish("jobs", b"x", headers={"zq.mine": "1"})
        with pytest.raises(zq.LimitError):
            p.publish("jobs", b"x" * 2048)
        assert p.publish("jobs", b"fine") > 0  # the same session, still serving
    with pytest.raises(zq.ConnectionLost, match="no answer"):
        zq.Publisher("tcp://127.0.0.1:1", connect_timeout=0.3)
    p.close()
    with pytest.raises(zq.ConnectionLost, match="closed"):
        p.publish("jobs", b"late")


def test_an_idle_publisher_outlives_its_session_and_a_killed_dispatcher(tmp_path):
    cfg = tmp_path / "zq.toml"
    cfg.write_text('[server]\nheartbeat = "100ms"\nheartbeat_liveness = 2\n')
    server = ServerProcess(tmp_path, config=cfg).start()
    try:
        with zq.Publisher(server.endpoint) as p:
            a = p.publish("crash", b"a")
            time.sleep(0.6)  # silent past the dead-peer window: the dispatcher ends the session
            b = p.publish("crash", b"b")  # told "no session", opens a new one and resends
            assert p.generation == 2
            server.kill()
            server.start()
            c = p.publish("crash", b"c", timeout=20)  # a new dispatcher: a new session
            assert p.generation == 3
        with zq.Worker(server.endpoint, "crash", max_backlog=8) as w:
            got = {}
            while len(got) < 3:
                m = w.get(5)
                assert m is not None, f"only {sorted(got)} after the restart"
                got[m.bookmark] = m.data
                m.ack()
        assert got == {a: b"a", b: b"b", c: b"c"}  # every confirmed message survived the SIGKILL
    finally:
        server.terminate()


# A process that used zq's clients must exit promptly: every session socket and its
# monitor closed on every path (closes, reconnects, constructors that give up), every
# close bounded. The three clients share their session sockets (zq.client.session), so
# all three are exercised here, each in a process of its own making: ``ctx.term()``
# returns only once every socket of the context is closed, and the parent's timeout
# turns a hang into a failure.
LIFECYCLE = r'''
import subprocess, sys, time
import zmq, zq
d = sys.argv[1]
ep = f"ipc://{d}/zq.sock"
def serve():
    return subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--data", f"{d}/journal", "--bind", ep],
                            stderr=subprocess.DEVNULL)
srv = serve()
try:
    for i in range(10):  # opened and closed
        with zq.connect(ep, connect_timeout=20) as c, c.subscribe("jobs", max_backlog=2) as s:
            c.publish("jobs", b"c")
            s.get(10).ack()
        with zq.Worker(ep, "jobs", connect_timeout=20) as w:
            w.get(0.01)
        with zq.Publisher(ep, connect_timeout=20) as p:
            p.publish("jobs", b"p")
    c = zq.connect(ep, connect_timeout=20)
    s = c.subscribe("jobs", max_backlog=2)
    w, p = zq.Worker(ep, "jobs", connect_timeout=20), zq.Publisher(ep, connect_timeout=20)
    for i in range(3):  # open while the dispatcher is killed and started again: new sessions
        srv.kill(); srv.wait(); srv = serve()
        c.publish("jobs", b"r", timeout=30); p.publish("jobs", b"r", timeout=30); w.get(0.3)
    srv.kill(); srv.wait()  # and closed while it is gone
    w.get(0.2)
    t = time.monotonic()
    s.close(); c.close(); w.close(); p.close()
    print(f"closed with the dispatcher gone in {time.monotonic() - t:.2f}s")
    for make in (lambda: zq.connect(ep, connect_timeout=0.3), lambda: zq.Worker(ep, "jobs", connect_timeout=0.3),
                 lambda: zq.Publisher(ep, connect_timeout=0.3)):
        try:  # no dispatcher at all: each constructor gives up, leaving nothing open
            make()
        except zq.ConnectionLost:
            pass
    ctx = zmq.Context.instance()
    print("left open:", [s for s in list(ctx._sockets) if not s.closed], flush=True)
    ctx.term()
    print("terminated")
finally:
    if srv.poll() is None:
        srv.kill()
'''


def test_clients_opened_closed_and_reconnected_leave_no_socket_open_and_close_in_bounded_time(tmp_path):
    import subprocess
    import sys

    from .support import ROOT, env

    t = time.monotonic()
    done = subprocess.run([sys.executable, "-c", LIFECYCLE, str(tmp_path)], env=env(), cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "terminated" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "left open: []" in done.stdout, done.stdout
    closed_s = float(done.stdout.split("closed with the dispatcher gone in ")[1].split("s")[0])
    assert closed_s < 5.0, done.stdout
    print(done.stdout, f"(the whole run: {time.monotonic() - t:.1f}s)")


CONSUMER = r'''
import json, signal, sys, time
import zq
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(time.monotonic()))
client = zq.connect(sys.argv[1], connect_timeout=20)
sub = client.subscribe("jobs", max_backlog=16)
print("ready", flush=True)
try:
    while not stop:
        m = sub.get(timeout=0.1)
        if m is not None:
            m.ack()
finally:
    sub.close()
    client.close()
print(f"closed in {time.monotonic() - stop[0]:.2f}s", flush=True)
'''


@pytest.mark.parametrize("dispatcher_at_sigterm", ["alive", "killed"])
def test_a_consumer_process_told_to_stop_exits_promptly(tmp_path, dispatcher_at_sigterm):
    """The bench's worker processes (bench/e2e.py): a zq.Client consumer whose SIGTERM
    handler ends its loop, then closes its subscription and its client. It exits within
    a few seconds, its dispatcher alive or gone (a close does not wait out the timeouts
    of a session that is lost)."""
    import signal
    import subprocess
    import sys

    from .support import ROOT, env

    server = ServerProcess(tmp_path).start()
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, server.endpoint], env=env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with zq.Publisher(server.endpoint) as p:
            p.publish_many("jobs", [b"m%d" % i for i in range(200)])
        time.sleep(0.3)
        if dispatcher_at_sigterm == "killed":
            server.kill()
            time.sleep(0.5)
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t
        assert proc.returncode == 0, err[-3000:]
        assert took < 5.0, (took, out, err[-2000:])
        print(out.strip(), f"(exited {took:.2f}s after SIGTERM)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if dispatcher_at_sigterm == "alive":
            server.terminate()


SIGNALLED_GETS = r"""
import signal, sys, time
import zq
runs = []
def slow_handler(*_):  # runs past what is left of get()'s wait
    t = time.monotonic() + 0.003
    while time.monotonic() < t:
        pass
    runs.append(1)
client = zq.connect(sys.argv[1], connect_timeout=20)
sub = client.subscribe("nothing-here", max_backlog=4)
signal.signal(signal.SIGALRM, slow_handler)
signal.setitimer(signal.ITIMER_REAL, 0.005, 0.005)
t0 = time.monotonic()
for _ in range(300):
    assert sub.get(timeout=0.002) is None
signal.setitimer(signal.ITIMER_REAL, 0, 0)
print(f"300 gets in {time.monotonic() - t0:.2f}s, {len(runs)} signals handled", flush=True)
sub.close()
client.close()
"""


def test_a_timed_get_returns_when_a_signal_handler_runs_past_its_deadline(tmp_path):
    """The hang of a SIGTERMed consumer (sessions 13-14): CPython's SimpleQueue.get(timeout)
    waits for good when a signal handler runs past the deadline (it then waits a negative
    time, which means forever). Subscription.get must not: signals every 5 ms whose handler
    takes 3 ms, against gets of 2 ms, hit that window in most of 300 gets."""
    import subprocess
    import sys

    from .support import ROOT, env

    server = ServerProcess(tmp_path).start()
    try:
        try:
            done = subprocess.run([sys.executable, "-c", SIGNALLED_GETS, server.endpoint], env=env(), cwd=ROOT,
                                  capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("Subscription.get(timeout) did not return: a signal handler made it wait for good")
        assert done.returncode == 0, done.stderr[-3000:]
        handled = int(done.stdout.split(", ")[1].split()[0])
        assert handled > 100, done.stdout  # (else the window was not tried)
        print(done.stdout.strip())
    finally:
        server.terminate()


def test_a_flush_that_races_the_end_of_its_session_returns_at_once(tmp_path):
    """A close found the session alive, the I/O thread then ended it and answered every
    flush waiting (none yet), and the close's own waiter, added just after, waited out
    its 5 s (CI saw a close take exactly 5.00 s). The race is forced here: the session
    ends between the check and the append."""
    import collections

    from .support import wait_until

    server = ServerProcess(tmp_path).start()
    c = zq.connect(server.endpoint, connect_timeout=20)
    try:
        assert c._serving

        class SessionEndsFirst(collections.deque):
            def append(self, fut):  # type: ignore[no-untyped-def]
                server.kill()
                wait_until(lambda: not c._serving, timeout=10, what="the I/O thread ending the session")
                super().append(fut)

        c._flush_waiters = SessionEndsFirst(c._flush_waiters)
        t = time.monotonic()
        c._flush_and_wait(5.0)
        assert time.monotonic() - t < 2.0
    finally:
        t = time.monotonic()
        c.close()
        assert time.monotonic() - t < 2.0
