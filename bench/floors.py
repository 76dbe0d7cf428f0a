"""Latency floors: what raw pyzmq costs on this machine, paced as zq's latency bench.

zq's latency targets are judged against these, measured in the same invocation: a
path that a raw relay (no journal, no engine, no client threads) cannot beat here,
zq cannot either.

* ``relay``: the publish -> worker path of ``bench.e2e.latency`` with nothing in it:
  a producer process sends one 128-byte frame per message over tcp loopback to a
  relay process (ROUTER), which confirms it to the producer and forwards it to one of
  4 worker processes in turn; each worker acks every frame. publish -> worker and
  publish -> confirm, as zq's latency rows.
* ``relay`` with ``commit``: the same, the relay storing each publish in LMDB (one
  put and its commit, zq's environment flags) before it confirms and forwards it: the
  floor of any dispatcher that journals before it sends, as zq does.
* ``tcp-echo``: a DEALER's round trip to a ROUTER echo in another process, over tcp.
* ``inproc-echo``: the same between two threads of one process over inproc://.
* ``thread-handoff``: one Python thread handing a timestamp to another through a
  ``queue.SimpleQueue``: the floor of any embedded path that crosses one thread (the
  direct path's publish -> worker crosses exactly one).
* ``direct-step``: ``zq.Publisher(d).publish`` on an embedded dispatcher, no worker:
  what the dispatcher's step costs the publishing thread (decode, engine, journal
  commit, confirmation), paced.
* ``zq-raw-clients``: a real ``zq serve`` with the relay case's raw sockets speaking
  ZQP/1 in place of ``zq.Client`` and ``zq.Worker`` (one message a PUBLISH frame, its
  CONFIRM awaited; each DELIVER acked at once): the server's share of zq's latency.

Every case is paced like ``bench.e2e.publish_paced``: a sleep until each send time,
never a spin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from bench.e2e import child_env, cpu_seconds, free_port, percentiles, publish_times, server_cpu, thread_cpu

SIZE = 128


def stamped() -> bytes:
    return time.time_ns().to_bytes(8, "big") + b"x" * (SIZE - 8)


def since_us(frame: bytes) -> float:
    return (time.time_ns() - int.from_bytes(frame[:8], "big")) / 1000


# ---------------------------------------------------------------- processes


def relay_main(endpoint: str, n: int, workers: int, journal: str = "") -> None:
    """ROUTER: W frames from workers say hello, A frames ack; anything else is a
    publish, confirmed and forwarded to the next worker in turn. ``journal``: a
    directory; each publish is first stored there, one LMDB write transaction per
    message, before it is confirmed or forwarded (``journal_writer``)."""
    import zmq

    put_and_commit, stored = journal_writer(journal) if journal else (None, lambda: 0)
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(endpoint)
    peers: list[bytes] = []
    while len(peers) < workers:
        peer, frame = sock.recv_multipart()
        if frame == b"W":
            peers.append(peer)
    print("ready", flush=True)
    cpu, threads = time.process_time(), thread_cpu(os.getpid())
    acked = turn = 0
    while acked < n:
        if not sock.poll(60_000):
            raise SystemExit("relay: nothing for 60 s")
        peer, frame = sock.recv_multipart()
        if frame == b"A":
            acked += 1
            continue
        if put_and_commit is not None:
            put_and_commit(frame)
        sock.send_multipart([peer, frame[:8]])  # the confirm carries the send time back
        sock.send_multipart([peers[turn], frame])
        turn = (turn + 1) % workers
    for p in peers:
        sock.send_multipart([p, b"Q"])
    print(json.dumps({"cpu_s": time.process_time() - cpu, "stored": stored(),  # what relaying cost, as a dispatcher's CPU
                      "threads": [threads, thread_cpu(os.getpid())]}), flush=True)


def journal_writer(path: str) -> tuple[Callable[[bytes], None], Callable[[], int]]:
    """``put_and_commit(frame)``, and ``stored()`` (the records in the file, read back
    from it: the row shows it). The least any journal of zq's kind does per message:
    one put (append, a big-endian u64 key) and its commit, in an environment opened as
    zq's journal opens its own (no sync at commit, no writemap), with no record
    encoding, no CRC, no second tree and no once-a-second sync."""
    import lmdb

    env = lmdb.open(path, map_size=1 << 30, max_dbs=5, sync=False, metasync=False, writemap=False, lock=True)
    db = env.open_db(b"msgs")
    seq = 0

    def put_and_commit(frame: bytes) -> None:
        nonlocal seq
        seq += 1
        with env.begin(write=True, db=db) as txn:
            txn.put(seq.to_bytes(8, "big"), frame, append=True)

    def stored() -> int:
        with env.begin(db=db) as txn:
            return int(txn.stat(db)["entries"])

    return put_and_commit, stored


def worker_main(endpoint: str) -> None:
    import zmq

    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(b"W")
    latencies = []
    while True:
        frame = sock.recv()
        if frame == b"Q":
            break
        latencies.append(since_us(frame))
        sock.send(b"A")
    print(json.dumps(latencies), flush=True)


def zqp_worker_main(endpoint: str, out: str) -> None:
    """A worker with no zq client code: HELLO, SUBSCRIBE, an ACK frame per DELIVER."""
    import signal

    import zmq

    from zq import wire

    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "floors-worker")))
    sock.send(wire.encode(wire.Subscribe(1, "w", "floors", 16, None)))
    latencies = []
    last_sent = time.monotonic()
    while not stop:
        if time.monotonic() - last_sent > 0.5:  # a worker the fairness leaves idle stays in the session
            sock.send(wire.encode(wire.Heartbeat()))
            last_sent = time.monotonic()
        if not sock.poll(100):
            continue
        msg = wire.server_decoder.decode(sock.recv())
        if type(msg) is wire.DeliverRecords:
            latencies += [since_us(r.payload) for r in msg.records]
            sock.send(wire.encode(wire.Ack("w", [r.seq for r in msg.records])))
            last_sent = time.monotonic()
    with open(out, "w") as f:
        json.dump(latencies, f)


def echo_main(endpoint: str) -> None:
    import zmq

    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(endpoint)
    print("ready", flush=True)
    while True:
        peer, frame = sock.recv_multipart()
        if frame == b"Q":
            return
        sock.send_multipart([peer, frame])


# -------------------------------------------------------------------- cases


def relay(seconds: float, rate: float = 2000, workers: int = 4, commit: bool = False) -> dict:
    """``commit``: the relay stores each publish in LMDB (``journal_writer``) before it
    confirms and forwards it, as zq commits before it sends (DESIGN: "feed the engine,
    commit once, then send everything"): the floor of any dispatcher that journals
    before delivering, in these processes."""
    import shutil
    import tempfile

    import zmq

    n = int(seconds * rate)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    me = [sys.executable, "-m", "bench.floors"]
    tmp = tempfile.mkdtemp(prefix="zq-floors-relay-") if commit else ""
    relay_proc = subprocess.Popen([*me, "relay", endpoint, str(n), str(workers), *([f"{tmp}/journal"] if commit else [])],
                                  env=child_env(), stdout=subprocess.PIPE, text=True)
    procs = [subprocess.Popen([*me, "worker", endpoint], env=child_env(), stdout=subprocess.PIPE, text=True)
             for _ in range(workers)]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        if "ready" not in relay_proc.stdout.readline():  # type: ignore[union-attr]
            raise RuntimeError("floors relay did not see its workers")
        sock.connect(endpoint)
        confirm_us: list[float] = []
        for _ in publish_times(n, rate):
            sock.send(stamped())
            # the confirm is awaited before the next send: zmq_poll cannot wait less than
            # a millisecond, and a loop of poll(0) would spin
            if not sock.poll(10_000):
                raise RuntimeError(f"floors relay confirmed {len(confirm_us)} of {n}")
            confirm_us.append(since_us(sock.recv()))
        deliver_us = [x for p in procs for x in json.loads(p.communicate(timeout=60)[0])]
        relayed = json.loads(relay_proc.communicate(timeout=60)[0])
        relay_cpu, relay_threads = relayed["cpu_s"], relayed["threads"]
    finally:
        sock.close()
        for p in [relay_proc, *procs]:
            if p.poll() is None:
                p.kill()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    case = "raw pyzmq relay, tcp loopback, 1 producer + relay + 4 worker processes"
    extra = {}
    if commit:
        case = ("raw pyzmq relay + an LMDB commit per message (one put, one transaction, before it is confirmed "
                "and forwarded), tcp loopback, 1 producer + relay + 4 worker processes")
        # Never synced: a floor for zq's batch and none durability, not for fsync's.
        extra = {"stored": relayed["stored"], "durability": "none (no sync: the floor of batch and none, not of fsync)"}
    return {"case": case, "rate": rate, **extra,
            "seconds": seconds, "messages": n, "publish_to_worker_us": percentiles(deliver_us),
            "publish_to_confirm_us": percentiles(confirm_us), **server_cpu(n, relay_cpu, *relay_threads)}


def zq_raw_clients(seconds: float, rate: float = 2000, workers: int = 4) -> dict:
    """``zq serve`` (durability batch) between raw ZQP/1 sockets: the server alone."""
    import shutil
    import signal
    import tempfile

    import zmq

    from zq import wire

    n = int(seconds * rate)
    tmp = tempfile.mkdtemp(prefix="zq-floors-")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--data", f"{tmp}/journal", "--bind", endpoint],
                              env=child_env(), stderr=subprocess.DEVNULL)
    outs = [f"{tmp}/w{i}.json" for i in range(workers)]
    procs = []
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        from zq.client import Client

        with Client(endpoint, connect_timeout=30) as c:  # the server answers: start the workers
            procs = [subprocess.Popen([sys.executable, "-m", "bench.floors", "zqp-worker", endpoint, out], env=child_env())
                     for out in outs]
            deadline = time.monotonic() + 30
            while len(c.stats()["queues"].get("floors", {}).get("consumers", [])) < workers:
                if time.monotonic() > deadline:
                    raise RuntimeError("floors workers did not subscribe")
                time.sleep(0.02)
        sock.connect(endpoint)
        sock.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "floors-producer")))
        if not sock.poll(10_000):
            raise RuntimeError("no WELCOME")
        sock.recv()
        confirm_us = []
        cpu_before, threads_before = cpu_seconds(server.pid), thread_cpu(server.pid)
        for i in publish_times(n, rate):
            sent = time.time_ns()
            sock.send(wire.encode(wire.Publish(i + 1, "floors", [(stamped(), {}, None)])))
            while True:  # the server's heartbeats come on the same socket
                if not sock.poll(10_000):
                    raise RuntimeError(f"zq confirmed {len(confirm_us)} of {n}")
                reply = wire.server_decoder.decode(sock.recv())
                if type(reply) is wire.Confirm and reply.req == i + 1:
                    break
            confirm_us.append((time.time_ns() - sent) / 1000)
        with Client(endpoint) as c:
            deadline = time.monotonic() + 30
            while c.stats()["queues"]["floors"]["acked"] < n:
                if time.monotonic() > deadline:
                    raise RuntimeError("not every message acked")
                time.sleep(0.05)
        server_cpu_s = cpu_seconds(server.pid) - cpu_before  # (with a few STATS and the wait's heartbeats)
        threads_after = thread_cpu(server.pid)
    finally:
        sock.close()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    deliver_us = [x for out in outs for x in json.loads(Path(out).read_text())]
    shutil.rmtree(tmp, ignore_errors=True)
    return {"case": "zq serve (batch) with raw ZQP/1 sockets as publisher and 4 workers, tcp loopback", "rate": rate,
            "seconds": seconds, "messages": n, "publish_to_worker_us": percentiles(deliver_us),
            "publish_to_confirm_us": percentiles(confirm_us), **server_cpu(n, server_cpu_s, threads_before, threads_after)}


def echo(seconds: float, rate: float, transport: str) -> dict:
    import zmq

    n = int(seconds * rate)
    ctx = zmq.Context.instance()
    if transport == "tcp":
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        server = subprocess.Popen([sys.executable, "-m", "bench.floors", "echo", endpoint], env=child_env(),
                                  stdout=subprocess.PIPE, text=True)
        server.stdout.readline()  # type: ignore[union-attr]
        case = "raw pyzmq DEALER -> ROUTER echo in another process, tcp loopback"
    else:
        endpoint = f"inproc://floors-echo-{time.monotonic_ns()}"
        ready = threading.Event()
        server = threading.Thread(target=echo_in_thread, args=(ctx, endpoint, ready), daemon=True)
        server.start()
        ready.wait(10)
        case = "raw pyzmq DEALER -> ROUTER echo in another thread, inproc"
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    rtt = []
    try:
        for _ in publish_times(n, rate):
            sock.send(stamped())
            if not sock.poll(10_000):
                raise RuntimeError("echo: no answer in 10 s")
            rtt.append(since_us(sock.recv()))
        sock.send(b"Q")
    finally:
        if transport == "tcp":
            server.wait(10)  # type: ignore[union-attr]
        else:
            server.join(10)
        sock.close()
    return {"case": case, "rate": rate, "seconds": seconds, "messages": n, "round_trip_us": percentiles(rtt)}


def echo_in_thread(ctx, endpoint: str, ready: threading.Event) -> None:  # type: ignore[no-untyped-def]
    import zmq

    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    ready.set()
    while True:
        peer, frame = sock.recv_multipart()
        if frame == b"Q":
            break
        sock.send_multipart([peer, frame])
    sock.close()


def thread_handoff(seconds: float, rate: float) -> dict:
    import queue

    n = int(seconds * rate)
    box: queue.SimpleQueue[int] = queue.SimpleQueue()
    waits: list[float] = []

    def take() -> None:
        for _ in range(n):
            sent = box.get()
            waits.append((time.time_ns() - sent) / 1000)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    for _ in publish_times(n, rate):
        box.put(time.time_ns())
    taker.join(30)
    return {"case": "one Python thread hands a timestamp to another (queue.SimpleQueue)", "rate": rate,
            "seconds": seconds, "messages": n, "handoff_us": percentiles(waits)}


def direct_step(seconds: float, rate: float) -> dict:
    import shutil
    import tempfile

    import zq

    n = int(seconds * rate)
    tmp = tempfile.mkdtemp(prefix="zq-bench-direct-")
    took: list[float] = []
    try:
        with zq.Dispatcher(zq.Config(data=f"{tmp}/journal", bind=[])) as d, zq.Publisher(d) as p:
            p.publish("floors", b"warm-up")
            for _ in publish_times(n, rate):
                started = time.time_ns()
                p.publish("floors", stamped())
                took.append((time.time_ns() - started) / 1000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"case": "zq.Publisher(d).publish on an embedded dispatcher (batch), no worker: the step", "rate": rate,
            "seconds": seconds, "messages": n, "publish_us": percentiles(took)}


def floors(seconds: float, rate: float = 2000) -> list[dict]:
    return [relay(seconds, rate), relay(seconds, rate, commit=True), zq_raw_clients(seconds, rate), echo(seconds, rate, "tcp"), echo(seconds, rate, "inproc"),
            thread_handoff(seconds, rate), direct_step(seconds, rate)]


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "relay":
        relay_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:6])
    elif role == "worker":
        worker_main(sys.argv[2])
    elif role == "zqp-worker":
        zqp_worker_main(sys.argv[2], sys.argv[3])
    elif role == "echo":
        echo_main(sys.argv[2])
