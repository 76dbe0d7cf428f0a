"""The ceiling: what Python + ZeroMQ allow on the standard workload, with no journal
and no engine. zq's throughput divided by this is the figure of merit.

Same process layout as ``bench.e2e`` (1 producer, a relay, 4 workers, tcp loopback,
128-byte messages, backlog 16, every message acknowledged), batched the way zq
batches: the producer keeps a window of 1,024 unconfirmed messages and sends what it
has in frames of up to 64, confirmed one frame at a time; the relay drains every
frame waiting, then sends each worker with credit one frame of up to its free credit;
a worker acks once per frame it received. The relay is a deque and a credit count per
worker: nothing is stored, routed by topic, leased or journaled.

Frames (one part each over DEALER/ROUTER): ``P`` + 128-byte payloads (publish),
``C`` + count (confirm), ``S`` + backlog (subscribe), ``D`` + payloads (deliver),
``A`` + count (ack).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from bench.e2e import child_env, cpu_seconds, free_port, server_cpu

SIZE = 128
_COUNT = struct.Struct(">I")


def relay(endpoint: str, n: int, workers: int) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    waiting: deque[bytes] = deque()
    cpu_ready = time.process_time()
    credit: dict[bytes, int] = {}
    acked = 0
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    deadline = time.monotonic() + 600
    while acked < n and time.monotonic() < deadline:
        if not poller.poll(100):
            continue
        for _ in range(4096):  # drain what is waiting, then dispatch once
            try:
                peer, frame = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            op = frame[:1]
            if op == b"P":
                body = memoryview(frame)[1:]
                waiting.extend(bytes(body[i:i + SIZE]) for i in range(0, len(body), SIZE))
                sock.send_multipart([peer, b"C" + _COUNT.pack(len(body) // SIZE)])
            elif op == b"A":
                count = _COUNT.unpack(frame[1:5])[0]
                credit[peer] += count
                acked += count
            elif op == b"S":
                credit[peer] = _COUNT.unpack(frame[1:5])[0]
                if len(credit) == workers:
                    print(json.dumps({"ready": True}), flush=True)  # the harness starts the producer now
                    cpu_ready = time.process_time()
        for peer, free in credit.items():
            if free and waiting:
                k = min(free, len(waiting))
                sock.send_multipart([peer, b"D" + b"".join(waiting.popleft() for _ in range(k))])
                credit[peer] = free - k
    print(json.dumps({"acked": acked, "cpu_s": time.process_time() - cpu_ready}), flush=True)
    sock.close(0)
    ctx.term()


def producer(endpoint: str, n: int) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    payload = b"x" * SIZE
    window, sent, confirmed = 1024, 0, 0
    first, cpu = time.time_ns(), time.process_time()
    while confirmed < n:
        while sent < n and sent - confirmed < window:
            k = min(64, n - sent, window - (sent - confirmed))
            sock.send(b"P" + payload * k)
            sent += k
        frame = sock.recv()
        confirmed += _COUNT.unpack(frame[1:5])[0]
        while sock.poll(0):
            confirmed += _COUNT.unpack(sock.recv()[1:5])[0]
    print(json.dumps({"first_ns": first, "last_confirm_ns": time.time_ns(), "cpu_s": time.process_time() - cpu}),
          flush=True)
    sock.close(0)
    ctx.term()


def worker(endpoint: str, backlog: int, out: str) -> None:
    import zmq

    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(b"S" + _COUNT.pack(backlog))
    count, last_ack = 0, 0
    while not stop:
        if not sock.poll(100):
            continue
        frame = sock.recv()
        k = 0
        for i in range(1, len(frame), SIZE):  # "process" each message as a zq worker does: look at it
            k += frame[i] >= 0
        count += k
        last_ack = time.time_ns()
        sock.send(b"A" + _COUNT.pack(k))
    Path(out).write_text(json.dumps({"count": count, "last_ack_ns": last_ack}))
    sock.close(0)
    ctx.term()


def throughput(n: int, workers: int = 4, backlog: int = 16) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="zq-ceiling-"))
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    env = child_env()
    me = [sys.executable, "-m", "bench.ceiling"]
    relay_proc = subprocess.Popen([*me, "relay", endpoint, str(n), str(workers)], env=env, stdout=subprocess.PIPE, text=True)
    outs = [tmp / f"w{i}.json" for i in range(workers)]
    procs = [subprocess.Popen([*me, "worker", endpoint, str(backlog), str(o)], env=env) for o in outs]
    try:
        ready = relay_proc.stdout.readline()  # every worker subscribed (zq's bench waits for them too)
        if "ready" not in ready:
            raise RuntimeError(f"ceiling relay did not see {workers} workers: {ready!r}")
        workers_before = sum(cpu_seconds(p.pid) for p in procs)
        prod = subprocess.run([*me, "producer", endpoint, str(n)], check=False, env=env, capture_output=True, text=True, timeout=600)
        if prod.returncode:
            raise RuntimeError(prod.stderr)
        relay_out, _ = relay_proc.communicate(timeout=600)  # it exits once every message is acked
        relay_report = json.loads(relay_out)
        if relay_report["acked"] < n:
            raise RuntimeError(f"ceiling relay saw {relay_out.strip()} of {n}")
        workers_cpu = sum(cpu_seconds(p.pid) for p in procs) - workers_before
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
        reports = [json.loads(o.read_text()) for o in outs]
    finally:
        for p in [relay_proc, *procs]:
            if p.poll() is None:
                p.kill()
    first = json.loads(prod.stdout)
    e2e = n / ((max(r["last_ack_ns"] for r in reports) - first["first_ns"]) / 1e9)
    return {"scenario": "ceiling", "system": "raw pyzmq relay", "messages": n, "workers": workers, "backlog": backlog,
            "e2e_msgs_per_s": round(e2e),
            "confirmed_msgs_per_s": round(n / ((first["last_confirm_ns"] - first["first_ns"]) / 1e9)),
            **server_cpu(n, relay_report["cpu_s"]),
            "workers_cpu_us_per_msg": round(workers_cpu / n * 1e6, 2),
            "producer_cpu_us_per_msg": round(first["cpu_s"] / n * 1e6, 2),
            "worker_shares": [r["count"] for r in reports]}


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "relay":
        relay(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif role == "producer":
        producer(sys.argv[2], int(sys.argv[3]))
    elif role == "worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    os._exit(0)
