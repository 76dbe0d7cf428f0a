"""Peers on the standard workload: Redis Streams, NATS JetStream, RabbitMQ (classic, quorum).

Each server is started here on 127.0.0.1 in a temporary directory (Debian packages:
redis-server, nats-server, rabbitmq-server) and driven with its standard Python client
(redis, nats-py, pika) in the same layout as zq: one producer process, 4 worker
processes, prefetch / batch = backlog 16, 128-byte bodies, every message acknowledged.

What a confirmation means for each (so like is compared with like):
* redis-streams: XADD reply after the AOF write(2); fsync about once a second (everysec);
* nats-jetstream: PubAck once the message is in the filestore's buffer; no fsync per message;
* rabbitmq-classic: publisher confirm once persisted (batched fsync) or delivered and acked;
* rabbitmq-quorum: publisher confirm after the Raft WAL is fdatasync'd (batched).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.e2e import child_env, cpu_seconds, free_port, server_cpu

STREAM = "bench"
PAYLOAD = b"x" * 128
CONFIRMS = {
    "redis-streams": "XADD reply after AOF write; fsync every second (appendfsync everysec)",
    "nats-jetstream": "PubAck when in the filestore buffer; no fsync per message",
    "rabbitmq-classic": "confirm when persisted (batched fsync) or delivered and acked",
    "rabbitmq-quorum": "confirm after fdatasync of the Raft WAL (batched)",
}


def wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


class Peer:
    """One server process in a temp dir."""

    def __init__(self, system: str) -> None:
        self.system = system
        self.tmp = tempfile.mkdtemp(prefix=f"zq-peer-{system}-")
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.epmd: subprocess.Popen | None = None

    def start(self) -> "Peer":
        if self.system == "redis-streams":
            cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.tmp,
                   "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no"]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_port(self.port, 20)
        elif self.system == "nats-jetstream":
            cmd = ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", self.tmp]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_port(self.port, 20)
        else:
            # Our own port mapper, in the foreground on a private port: we hold its PID.
            epmd_port = free_port()
            self.epmd = subprocess.Popen(["epmd", "-address", "127.0.0.1", "-port", str(epmd_port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_port(epmd_port, 10)
            env = dict(os.environ, HOME=self.tmp, RABBITMQ_NODENAME=f"bench{self.port}@localhost",
                       ERL_EPMD_PORT=str(epmd_port),
                       RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT=str(self.port),
                       RABBITMQ_DIST_PORT=str(free_port()), ERL_EPMD_ADDRESS="127.0.0.1",
                       RABBITMQ_MNESIA_BASE=f"{self.tmp}/mnesia", RABBITMQ_LOG_BASE=f"{self.tmp}/log",
                       RABBITMQ_ENABLED_PLUGINS_FILE=f"{self.tmp}/enabled_plugins",
                       RABBITMQ_CONFIG_FILE=f"{self.tmp}/rabbitmq", RABBITMQ_PID_FILE=f"{self.tmp}/broker.pid")
            Path(f"{self.tmp}/enabled_plugins").write_text("[].\n")
            # Debian's wrapper drops from root to the rabbitmq user: give it the directory.
            for path in (self.tmp, f"{self.tmp}/enabled_plugins"):
                shutil.chown(path, "rabbitmq", "rabbitmq")
            os.chmod(self.tmp, 0o755)
            self.proc = subprocess.Popen(["rabbitmq-server"], env=env, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
            wait_port(self.port, 90)
        return self

    def server_pid(self) -> int | None:
        """The server process itself (RabbitMQ's broker runs below a wrapper: its PID file)."""
        if self.system.startswith("rabbitmq"):
            pid_file = Path(f"{self.tmp}/broker.pid")
            return int(pid_file.read_text()) if pid_file.exists() else None
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        if self.system.startswith("rabbitmq"):
            self.stop_rabbit()
        elif self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def stop_rabbit(self) -> None:
        """The broker runs as another user below `su`: signal it by its own PID file."""
        pid_file = Path(f"{self.tmp}/broker.pid")
        pid = int(pid_file.read_text()) if pid_file.exists() else None
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.1)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.epmd is not None:
            self.epmd.terminate()
            self.epmd.wait(10)


def run(system: str, n: int, workers: int = 4, backlog: int = 16) -> dict:
    peer = Peer(system).start()
    procs: list[subprocess.Popen] = []
    outs = [Path(peer.tmp) / f"w{i}.json" for i in range(workers)]
    try:
        setup(system, peer.port)
        for out in outs:
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.peers", "worker", system, str(peer.port),
                                           str(backlog), str(out)], env=child_env()))
        time.sleep(1.0)  # let the workers attach (they wait on an empty stream / queue)
        pid = peer.server_pid()
        cpu_before = cpu_seconds(pid) if pid else None
        prod = subprocess.run([sys.executable, "-m", "bench.peers", "producer", system, str(peer.port), str(n)],
                              env=child_env(), capture_output=True, text=True, timeout=900)
        if prod.returncode:
            raise RuntimeError(prod.stderr[-2000:])
        p = json.loads(prod.stdout)
        deadline = time.monotonic() + 600
        while sum(json.loads(o.read_text())["count"] for o in outs if o.exists()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system}: not all {n} messages acked")
            dead = [w.returncode for w in procs if w.poll() is not None]
            if dead:
                raise RuntimeError(f"{system}: a worker died (exit {dead[0]})")
            time.sleep(0.1)
        reports = [json.loads(o.read_text()) for o in outs]
        cpu = cpu_seconds(pid) - cpu_before if pid and cpu_before is not None else None
    finally:
        for w in procs:
            w.send_signal(signal.SIGTERM)
        for w in procs:
            try:
                w.wait(10)
            except subprocess.TimeoutExpired:
                w.kill()
        peer.stop()
    last_ack = max(r["last_ack_ns"] for r in reports)
    return {
        "system": system, "messages": n, "confirm_means": CONFIRMS[system],
        "e2e_msgs_per_s": round(n / ((last_ack - p["first_ns"]) / 1e9)),
        "confirmed_msgs_per_s": round(n / ((p["last_confirm_ns"] - p["first_ns"]) / 1e9)),
        **(server_cpu(n, cpu) if cpu is not None else {"server_cpu_us_per_msg": None}),
    }


# --------------------------------------------------------------------- setup


def setup(system: str, port: int) -> None:
    if system == "redis-streams":
        import redis

        r = redis.Redis(port=port)
        r.xgroup_create(STREAM, "workers", id="0", mkstream=True)
    elif system == "nats-jetstream":
        async def main() -> None:
            import nats
            from nats.js.api import RetentionPolicy, StorageType

            nc = await nats.connect(f"nats://127.0.0.1:{port}")
            js = nc.jetstream()
            await js.add_stream(name="BENCH", subjects=[STREAM], retention=RetentionPolicy.WORK_QUEUE,
                                storage=StorageType.FILE)
            await nc.close()

        asyncio.run(main())
    else:
        import pika

        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        args = {"x-queue-type": "quorum"} if system == "rabbitmq-quorum" else {}
        ch.queue_declare(STREAM, durable=True, arguments=args)
        conn.close()


# --------------------------------------------------------------- producers


# The producers of every system keep the same window of unconfirmed messages as zq's
# (16 frames of 64): NATS and RabbitMQ 1,024 outstanding acks, Redis 1,024 XADDs a pipeline.
REDIS_PIPELINE = 1024


def producer(system: str, port: int, n: int) -> dict:
    if system == "redis-streams":
        import redis

        r = redis.Redis(port=port)
        first = time.time_ns()
        for i in range(0, n, REDIS_PIPELINE):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(REDIS_PIPELINE, n - i)):
                pipe.xadd(STREAM, {"d": PAYLOAD})
            pipe.execute()
        return {"first_ns": first, "last_confirm_ns": time.time_ns()}
    if system == "nats-jetstream":
        return asyncio.run(nats_producer(port, n))
    return rabbit_producer(port, n)


async def nats_producer(port: int, n: int) -> dict:
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    window = asyncio.Semaphore(1024)

    async def one() -> None:
        try:
            await js.publish(STREAM, PAYLOAD)
        finally:
            window.release()

    first = time.time_ns()
    tasks = []
    for _ in range(n):
        await window.acquire()
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    last = time.time_ns()
    await nc.close()
    return {"first_ns": first, "last_confirm_ns": last}


def rabbit_producer(port: int, n: int) -> dict:
    """pika's asynchronous connection with publisher confirms, at most 1024 unconfirmed."""
    import pika

    state = {"sent": 0, "confirmed": 0, "first": 0, "last": 0}
    params = pika.ConnectionParameters("127.0.0.1", port)

    def on_open(conn):  # type: ignore[no-untyped-def]
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch):  # type: ignore[no-untyped-def]
        ch.confirm_delivery(lambda frame: on_confirm(ch, frame))
        state["first"] = time.time_ns()
        pump(ch)

    def pump(ch):  # type: ignore[no-untyped-def]
        props = pika.BasicProperties(delivery_mode=2)
        while state["sent"] < n and state["sent"] - state["confirmed"] < 1024:
            ch.basic_publish("", STREAM, PAYLOAD, props)
            state["sent"] += 1

    def on_confirm(ch, frame):  # type: ignore[no-untyped-def]
        tag, multiple = frame.method.delivery_tag, frame.method.multiple
        state["confirmed"] = tag if multiple else max(state["confirmed"], tag)
        if state["confirmed"] >= n:
            state["last"] = time.time_ns()
            conn.close()
        else:
            pump(ch)

    conn = pika.SelectConnection(params, on_open_callback=on_open,
                                 on_close_callback=lambda c, reason: c.ioloop.stop())
    conn.ioloop.start()  # stopped by on_close_callback once every confirm is in
    return {"first_ns": state["first"], "last_confirm_ns": state["last"] or time.time_ns()}


# ------------------------------------------------------------------ workers


def worker(system: str, port: int, backlog: int, out: str) -> None:
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    count, last = 0, 0

    def report() -> None:  # atomic: the orchestrator polls these files
        Path(out + ".tmp").write_text(json.dumps({"count": count, "last_ack_ns": last}))
        os.replace(out + ".tmp", out)

    if system == "redis-streams":
        import redis

        r = redis.Redis(port=port)
        name = f"w{os.getpid()}"
        ids: list = []
        while not stop:
            # One round trip a batch: the XACK of the last batch rides with the next read.
            pipe = r.pipeline(transaction=False)
            if ids:
                pipe.xack(STREAM, "workers", *ids)
                count += len(ids)
                last = time.time_ns()
            pipe.xreadgroup("workers", name, {STREAM: ">"}, count=backlog, block=100)
            got = pipe.execute()[-1]
            ids = [mid for _, entries in got for mid, _ in entries] if got else []
            if not ids:
                report()  # idle: tell the orchestrator where we are (never during the run)
    elif system == "nats-jetstream":
        async def main() -> None:
            nonlocal count, last
            import nats
            from nats.errors import TimeoutError as NatsTimeout

            nc = await nats.connect(f"nats://127.0.0.1:{port}")
            js = nc.jetstream()
            sub = await js.pull_subscribe(STREAM, durable="workers")
            while not stop:
                try:
                    msgs = await sub.fetch(backlog, timeout=0.2)
                except (NatsTimeout, asyncio.TimeoutError):  # nats-py raises either on an idle fetch
                    report()  # idle
                    continue
                for m in msgs:
                    await m.ack()
                count += len(msgs)
                last = time.time_ns()
            await nc.close()

        asyncio.run(main())
    else:
        import pika

        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=backlog)
        for method, _, _ in ch.consume(STREAM, inactivity_timeout=0.2):
            if stop:
                break
            if method is None:
                report()  # idle
                continue
            ch.basic_ack(method.delivery_tag)
            count += 1
            last = time.time_ns()
        conn.close()
    report()


# ------------------------------------------------------------------- latency


def latency(seconds: float, rate: float = 2000, workers: int = 4, backlog: int = 16) -> dict:
    """Redis Streams on the latency workload of ``bench.e2e.latency``: a paced producer
    (one XADD a message, its reply the confirmation), four consumer-group workers (XACK
    riding on the next XREADGROUP, as in ``run``), publish -> worker measured from a
    timestamp in the payload. Run beside zq's rows in the same invocation."""
    from bench.e2e import percentiles

    n = int(seconds * rate)
    peer = Peer("redis-streams").start()
    procs: list[subprocess.Popen] = []
    outs = [Path(peer.tmp) / f"lat{i}.json" for i in range(workers)]
    try:
        setup("redis-streams", peer.port)
        for out in outs:
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.peers", "latency-worker", "redis-streams",
                                           str(peer.port), str(backlog), str(out)], env=child_env()))
        time.sleep(1.0)  # let the workers attach
        pid = peer.server_pid()
        cpu_before = cpu_seconds(pid) if pid else None
        prod = subprocess.run([sys.executable, "-m", "bench.peers", "latency-producer", "redis-streams",
                               str(peer.port), str(n), str(rate)], env=child_env(), capture_output=True, text=True,
                              timeout=900)
        if prod.returncode:
            raise RuntimeError(prod.stderr[-2000:])
        confirm_us = json.loads(prod.stdout)["confirm_us"]
        deadline = time.monotonic() + 120
        while sum(json.loads(o.read_text())["count"] for o in outs if o.exists()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError("redis-streams: not all latency messages were taken")
            time.sleep(0.1)
        cpu = cpu_seconds(pid) - cpu_before if pid and cpu_before is not None else None
    finally:
        for w in procs:
            w.send_signal(signal.SIGTERM)
        for w in procs:
            try:
                w.wait(10)
            except subprocess.TimeoutExpired:
                w.kill()
        deliver_us = [x for o in outs if o.exists() for x in json.loads(o.read_text()).get("latencies_us", [])]
        peer.stop()
    return {"scenario": "latency", "system": "redis-streams", "rate": rate, "seconds": seconds,
            "durability": "AOF, fsync every second", "transport": "tcp loopback", "messages": n, "publish_to_worker_us": percentiles(deliver_us),
            "publish_to_confirm_us": percentiles(confirm_us),
            **(server_cpu(n, cpu) if cpu is not None else {"server_cpu_us_per_msg": None})}


def latency_producer(port: int, n: int, rate: float) -> dict:
    import redis

    from bench.e2e import publish_times

    r = redis.Redis(port=port)
    confirm_us = []
    for _ in publish_times(n, rate):
        sent = time.time_ns()
        r.xadd(STREAM, {"d": sent.to_bytes(8, "big") + PAYLOAD[8:]})
        confirm_us.append((time.time_ns() - sent) / 1000)
    return {"confirm_us": confirm_us}


def latency_worker(port: int, backlog: int, out: str) -> None:
    import redis

    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    r = redis.Redis(port=port)
    name = f"w{os.getpid()}"
    ids: list = []
    latencies: list[float] = []

    def report() -> None:
        Path(out + ".tmp").write_text(json.dumps({"count": len(latencies), "latencies_us": latencies}))
        os.replace(out + ".tmp", out)

    while not stop:
        pipe = r.pipeline(transaction=False)
        if ids:
            pipe.xack(STREAM, "workers", *ids)
        pipe.xreadgroup("workers", name, {STREAM: ">"}, count=backlog, block=100)
        got = pipe.execute()[-1]
        now = time.time_ns()
        ids = []
        for _, entries in got or []:
            for mid, fields in entries:
                latencies.append((now - int.from_bytes(fields[b"d"][:8], "big")) / 1000)
                ids.append(mid)
        if not ids:
            report()
    report()


if __name__ == "__main__":
    role, system = sys.argv[1], sys.argv[2]
    if role == "producer":
        print(json.dumps(producer(system, int(sys.argv[3]), int(sys.argv[4]))))
    elif role == "worker":
        worker(system, int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif role == "latency-producer":
        print(json.dumps(latency_producer(int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))))
    elif role == "latency-worker":
        latency_worker(int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
