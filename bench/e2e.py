"""End-to-end scenarios: `zq serve`, one publisher process, worker processes, tcp loopback.

The layout is ANCHORS.md's standard workload: 1 producer process, 4 worker processes,
backlog 16 each, 128-byte bodies, every message acknowledged by the worker.

* e2e throughput      = N / (last ack by a worker - first publish)
* publisher-confirmed = N / (last confirm - first publish)
* latency             = publish -> worker (payload carries time_ns) and publish -> confirm
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "bench"
BENCH_STANDBY_SECRET = "zq-bench-standby-secret"  # replicas_ack on a lone leader: its standbys show it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (from /proc): what a dispatcher costs its host."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """A process's CPU by kind of thread (from /proc), in seconds: its main thread (zq
    serve's loop, the relay's), libzmq's I/O threads, and the rest. Where a dispatcher's
    CPU goes at a low rate: ZeroMQ's own thread is paid by any dispatcher on it."""
    out = {"main thread": 0.0, "ZeroMQ I/O threads": 0.0, "other threads": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # (a thread that ended meanwhile)
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        kind = ("main thread" if task.name == str(pid) else
                "ZeroMQ I/O threads" if name.startswith("ZMQbg/IO") else "other threads")
        out[kind] += (int(fields[11]) + int(fields[12])) / tick
    return out


def server_cpu(n: int, seconds: float, before: dict[str, float] | None = None,
               after: dict[str, float] | None = None) -> dict:
    """The dispatcher's CPU per message, and what one core of it would carry; with
    ``thread_cpu`` taken before and after, the same split by kind of thread."""
    out = {"server_cpu_us_per_msg": round(seconds / n * 1e6, 2),
           "msgs_per_server_core_s": round(n / seconds) if seconds > 0 else None}
    if before is not None and after is not None:
        out["server_cpu_us_per_msg_by_thread"] = {k: round((after[k] - before[k]) / n * 1e6, 1) for k in after}
    return out


def child_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def percentiles(values: list[float], ps=(50, 99, 99.9)) -> dict:
    if not values:
        return {f"p{p}": None for p in ps}
    v = sorted(values)
    return {f"p{p}": round(v[min(len(v) - 1, int(len(v) * p / 100))], 1) for p in ps}


class Fleet:
    """A `zq serve` and N worker processes; workers report on SIGTERM.

    ``cluster``: instead, an elected cluster of ``1 + max(replicas_ack, 1)`` nodes and a
    ZooKeeper (zq.testing), the workers and producer on its leader. ``serve_module``: the
    module run as ``python -m MODULE serve ...`` (bench.loopcost's counting one)."""

    def __init__(self, workers: int, backlog: int, durability: str, groups: int = 0, consumer: str = "worker",
                 group_policy: str = "sequenced", replicas_ack: int = 0, cluster: bool = False,
                 serve_module: str = "zq.cli") -> None:
        self.tmp = tempfile.mkdtemp(prefix="zq-bench-")
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.zookeeper = self.cluster = None
        self.standbys: list[subprocess.Popen] = []
        if cluster:
            from zq.testing.cluster import Cluster
            from zq.testing.zookeeper import ZooKeeper

            self.zookeeper = ZooKeeper(Path(self.tmp) / "zk").start()
            self.cluster = Cluster(Path(self.tmp) / "cluster", self.zookeeper.hosts, nodes=1 + max(replicas_ack, 1),
                                   path="/zq/bench", settings=f'durability = "{durability}"\n',
                                   cluster_settings=f"replicas_ack = {replicas_ack}", heartbeat="1s")
            self.cluster.start()
            leader, _ = self.cluster.leader(timeout=60)
            self.endpoint = self.cluster.endpoint(leader)
            self.server = self.cluster.procs[leader]
        else:
            extra = []
            if replicas_ack:  # confirmations wait for that many standbys (each a `zq standby` process)
                Path(self.tmp, "zq.toml").write_text(f'[cluster]\nreplicas_ack = {replicas_ack}\n'
                                                     f'standby_secret = "{BENCH_STANDBY_SECRET}"\n')
                extra = ["--config", f"{self.tmp}/zq.toml"]
            self.server = subprocess.Popen(
                [sys.executable, "-m", serve_module, "serve", "--data", f"{self.tmp}/journal", "--bind", self.endpoint,
                 "--durability", durability, *extra], env=child_env(), stderr=subprocess.DEVNULL,
            )
            self.standbys = [
                subprocess.Popen([sys.executable, "-m", "zq.cli", "standby", self.endpoint, "--data",
                                  f"{self.tmp}/standby{i}"], env={**child_env(), "ZQ_STANDBY_SECRET": BENCH_STANDBY_SECRET},
                                 stderr=subprocess.DEVNULL)
                for i in range(replicas_ack)
            ]
        from zq.client import Client

        with Client(self.endpoint, connect_timeout=30) as c:
            if group_policy != "sequenced":  # (the default of an auto-created queue)
                c.create_queue(QUEUE, group_policy=group_policy)
            c.publish(QUEUE, b"warm-up")  # creates the queue; drained by the first worker
        self.outs = [Path(self.tmp) / f"w{i}.json" for i in range(workers)]
        self.workers = [
            subprocess.Popen([sys.executable, "-m", "bench.e2e", "worker", self.endpoint, str(backlog), str(out), consumer],
                             env=child_env())
            for out in self.outs
        ]
        deadline = time.monotonic() + 30
        with Client(self.endpoint) as c:
            while len(c.stats()["queues"][QUEUE]["consumers"]) < workers:
                if time.monotonic() > deadline:
                    raise RuntimeError("workers did not subscribe")
                time.sleep(0.02)
            while c.stats()["queues"][QUEUE]["acked"] < 1:
                time.sleep(0.01)
        self.groups = groups

    def wait_acked(self, n: int, timeout: float) -> None:
        from zq.client import Client

        deadline = time.monotonic() + timeout
        with Client(self.endpoint) as c:
            while c.stats()["queues"][QUEUE]["acked"] < n + 1:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {c.stats()['queues'][QUEUE]['acked'] - 1} of {n} acked in {timeout}s")
                time.sleep(0.05)  # stats cost the server CPU (a group summary): poll gently

    def reports(self) -> list[dict]:
        for w in self.workers:
            w.send_signal(signal.SIGTERM)
        for w in self.workers:
            w.wait(30)
        return [json.loads(out.read_text()) for out in self.outs]

    def close(self) -> None:
        for w in self.workers:
            if w.poll() is None:
                w.kill()
        for s in self.standbys:
            s.terminate()
            try:
                s.wait(30)
            except subprocess.TimeoutExpired:
                s.kill()
        if self.cluster is not None:
            self.cluster.close()
            self.zookeeper.stop()  # type: ignore[attr-defined]
        else:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                self.server.kill()
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)


def run_producer(endpoint: str, n: int, mode: str, groups: int, rate: float) -> dict:
    cmd = [sys.executable, "-m", "bench.e2e", "producer", endpoint, str(n), mode, str(groups), str(rate)]
    out = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout)


def throughput(n: int, *, durability: str = "batch", workers: int = 4, backlog: int = 16, mode: str = "async", groups: int = 0,
               consumer: str = "worker", group_policy: str = "sequenced", replicas_ack: int = 0,
               cluster: bool = False, serve_module: str = "zq.cli") -> dict:
    fleet = Fleet(workers, backlog, durability, groups, consumer, group_policy, replicas_ack, cluster, serve_module)
    try:
        cpu_before = cpu_seconds(fleet.server.pid)
        workers_before = sum(cpu_seconds(w.pid) for w in fleet.workers)
        prod = run_producer(fleet.endpoint, n, mode, groups, 0)
        fleet.wait_acked(n, timeout=600)
        cpu = cpu_seconds(fleet.server.pid) - cpu_before
        workers_cpu = sum(cpu_seconds(w.pid) for w in fleet.workers) - workers_before
        reports = fleet.reports()
    finally:
        fleet.close()
    last_ack = max(r["last_ack_ns"] for r in reports)
    e2e = n / ((last_ack - prod["first_ns"]) / 1e9)
    confirmed = n / ((prod["last_confirm_ns"] - prod["first_ns"]) / 1e9)
    return {
        "scenario": "throughput", "messages": n, "durability": durability, "workers": workers, "backlog": backlog,
        "publish": mode, "producer": PRODUCERS[mode], "groups": groups, "group_policy": group_policy if groups else None,
        "consumer": CONSUMERS[consumer], "replicas_ack": replicas_ack,
        **({"cluster": f"{1 + max(replicas_ack, 1)} nodes, ZooKeeper"} if cluster else {}),
        "e2e_msgs_per_s": round(e2e), "confirmed_msgs_per_s": round(confirmed),
        **server_cpu(n, cpu),
        # The clients' CPU per message (the workers' processes, all threads; the producer's
        # while publishing): with the server's, what the two cores are spent on.
        "workers_cpu_us_per_msg": round(workers_cpu / n * 1e6, 2),
        "producer_cpu_us_per_msg": round(prod["cpu_s"] / n * 1e6, 2),
        "worker_shares": [r["count"] for r in reports],
    }


PRODUCER_CHUNK = 1024  # a publish_many call's messages (what Redis's producer pipelines: bench.peers)
PRODUCERS = {
    "async": "zq.Client, publish_async a message",
    "batch64": "zq.Client, publish_many_async, frames of 64",
    "publisher-many": "zq.Publisher, publish_many of 1,024",
    "many": "zq.Client (zq.connect), publish_many of 1,024",
}
PUBLISHERS = {
    "paced": "zq.Client, publish_async",
    "paced-publisher": "zq.Publisher (single-threaded), publish",
}


def latency(seconds: float, *, rate: float = 2000, durability: str = "batch", workers: int = 4, backlog: int = 16,
            consumer: str = "worker", publisher: str = "paced", serve_module: str = "zq.cli") -> dict:
    n = int(seconds * rate)
    fleet = Fleet(workers, backlog, durability, consumer=consumer, serve_module=serve_module)
    try:
        cpu_before, threads_before = cpu_seconds(fleet.server.pid), thread_cpu(fleet.server.pid)
        prod = run_producer(fleet.endpoint, n, publisher, 0, rate)
        fleet.wait_acked(n, timeout=60 + seconds)
        cpu = cpu_seconds(fleet.server.pid) - cpu_before  # (at a low rate: each message pays whole iterations)
        threads_after = thread_cpu(fleet.server.pid)
        reports = fleet.reports()
    finally:
        fleet.close()
    deliver = [x for r in reports for x in r["latencies_us"]]
    return {
        "scenario": "latency", "rate": rate, "seconds": seconds, "durability": durability, "transport": "tcp loopback",
        "consumer": CONSUMERS[consumer], "publisher": PUBLISHERS[publisher],
        "messages": n, "publish_to_worker_us": percentiles(deliver), "publish_to_confirm_us": percentiles(prod["confirm_us"]),
        **server_cpu(n, cpu, threads_before, threads_after),
    }


def embedded_latency(seconds: float, *, rate: float = 2000, durability: str = "batch", backlog: int = 16,
                     clients: str = "publisher+worker") -> dict:
    """An embedded dispatcher, one in-process worker over inproc://, a paced publisher
    on the main thread; the host process otherwise idle. ``clients``: the single-threaded
    ``zq.Publisher`` and ``zq.Worker`` (three threads in all: publisher, dispatcher,
    worker), or ``zq.Client`` for both (each adds an I/O thread: five in all); or
    ``direct``: ``zq.Publisher(d)`` and ``zq.Worker(d, ...)`` on the in-process path (the
    publishing thread steps the dispatcher; one hand-off, to the worker's thread)."""
    if clients in ("publisher+worker", "direct"):
        return embedded_latency_direct(seconds, rate=rate, durability=durability, backlog=backlog,
                                       direct=clients == "direct")
    import threading

    import zq
    from zq.server.config import Config

    n = int(seconds * rate)
    tmp = tempfile.mkdtemp(prefix="zq-bench-embedded-")
    d = zq.Dispatcher(Config(data=f"{tmp}/journal", bind=[], durability=durability)).start()
    deliver_us: list[float] = []
    confirm_us: list[float] = []
    got = threading.Event()
    try:
        with zq.connect(d.inproc) as pub, zq.connect(d.inproc) as wc:
            pub.publish(QUEUE, b"warm-up")
            sub = wc.subscribe(QUEUE, max_backlog=backlog)

            def work() -> None:
                seen = 0
                while seen <= n:
                    msg = sub.get(timeout=30)
                    if msg is None:
                        return
                    now = time.time_ns()
                    if msg.data != b"warm-up":
                        deliver_us.append((now - int.from_bytes(msg.data[:8], "big")) / 1000)
                    msg.ack()
                    seen += 1
                got.set()

            worker_thread = threading.Thread(target=work, name="bench-embedded-worker", daemon=True)
            worker_thread.start()
            publish_paced(pub, n, rate, confirm_us)
            if not got.wait(60):
                raise RuntimeError(f"the embedded worker got {len(deliver_us)} of {n}")
            sub.close()
    finally:
        d.stop()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "scenario": "latency", "rate": rate, "seconds": seconds, "durability": durability,
        "transport": "inproc (embedded)", "clients": "zq.Client (I/O threads)", "messages": n,
        "publish_to_worker_us": percentiles(deliver_us), "publish_to_confirm_us": percentiles(confirm_us),
    }


def embedded_latency_direct(seconds: float, *, rate: float, durability: str, backlog: int, direct: bool) -> dict:
    """The embedded shape of examples/embedded_dispatcher.py: zq.Publisher on the main
    thread, zq.Worker on one thread, no client I/O threads; over inproc://, or
    ``direct``: given the dispatcher itself (no sockets; zq.server.local)."""
    import shutil
    import threading

    import zq
    from zq.server.config import Config

    n = int(seconds * rate)
    tmp = tempfile.mkdtemp(prefix="zq-bench-embedded-")
    d = zq.Dispatcher(Config(data=f"{tmp}/journal", bind=[], durability=durability)).start()
    target = d if direct else d.inproc
    deliver_us: list[float] = []
    confirm_us: list[float] = []
    ready, done = threading.Event(), threading.Event()
    payload = b"x" * 128

    def work() -> None:
        with zq.Worker(target, QUEUE, max_backlog=backlog, name="bench-embedded-worker") as w:
            ready.set()
            seen = 0
            while seen < n:
                msg = w.get(timeout=30)
                if msg is None:
                    return
                now = time.time_ns()
                deliver_us.append((now - int.from_bytes(msg.data[:8], "big")) / 1000)
                msg.ack()
                seen += 1
        done.set()

    try:
        with zq.Publisher(target, name="bench-embedded-publisher") as pub:
            pub.publish(QUEUE, b"warm-up")  # creates the queue
            with zq.connect(d.inproc) as c:
                c.purge(QUEUE)
            worker = threading.Thread(target=work, name="bench-embedded-worker", daemon=True)
            worker.start()
            if not ready.wait(30):
                raise RuntimeError("the embedded worker did not start")
            for _ in publish_times(n, rate):
                sent = time.time_ns()
                pub.publish(QUEUE, sent.to_bytes(8, "big") + payload[8:])  # returns once journaled
                confirm_us.append((time.time_ns() - sent) / 1000)
            if not done.wait(60):
                raise RuntimeError(f"the embedded worker got {len(deliver_us)} of {n}")
            worker.join(10)
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "scenario": "latency", "rate": rate, "seconds": seconds, "durability": durability,
        "transport": "direct (embedded, no sockets)" if direct else "inproc (embedded)",
        "clients": "zq.Publisher(d) + zq.Worker(d, ...) (one hand-off)" if direct
        else "zq.Publisher + zq.Worker (no I/O threads)", "messages": n,
        "publish_to_worker_us": percentiles(deliver_us), "publish_to_confirm_us": percentiles(confirm_us),
    }


# ------------------------------------------------------------------ child processes


def producer(endpoint: str, n: int, mode: str, groups: int, rate: float) -> None:
    from zq.client import Client

    payload = b"x" * 128
    confirm_us: list[float] = []
    if mode in ("paced-publisher", "publisher-many"):  # the lean publisher: single-threaded
        from zq.client.publisher import Publisher

        with Publisher(endpoint, name="bench-producer") as p:
            first, cpu = time.time_ns(), time.process_time()
            if mode == "publisher-many":
                publish_chunks(p, n, payload)
            else:
                for _ in publish_times(n, rate):
                    sent = time.time_ns()
                    p.publish(QUEUE, sent.to_bytes(8, "big") + payload[8:])
                    confirm_us.append((time.time_ns() - sent) / 1000)
            last, cpu = time.time_ns(), time.process_time() - cpu
    else:
        with Client(endpoint, name="bench-producer", window=16 * 64) as c:
            first, cpu = time.time_ns(), time.process_time()
            if mode == "many":  # zq.connect's client
                publish_chunks(c, n, payload)
            elif mode == "async":
                futures = [c.publish_async(QUEUE, payload, group=f"g{i % groups}" if groups else None) for i in range(n)]
                for f in futures:
                    f.result(600)
            elif mode == "batch64":
                pending = []
                for i in range(0, n, 64):
                    pending += c.publish_many_async(QUEUE, [payload] * min(64, n - i))
                    if len(pending) > 16:
                        pending.pop(0).result(600)
                for f in pending:
                    f.result(600)
            elif mode == "paced":
                publish_paced(c, n, rate, confirm_us)
            last, cpu = time.time_ns(), time.process_time() - cpu
    print(json.dumps({"first_ns": first, "last_confirm_ns": last, "confirm_us": confirm_us, "cpu_s": cpu}))


def publish_chunks(client, n: int, payload: bytes) -> None:  # type: ignore[no-untyped-def]
    """``n`` messages, ``PRODUCER_CHUNK`` a ``publish_many`` call (each waits for its
    confirmations): ``zq.Publisher`` and ``zq.Client`` alike."""
    for i in range(0, n, PRODUCER_CHUNK):
        client.publish_many(QUEUE, [payload] * min(PRODUCER_CHUNK, n - i), timeout=600)


def publish_paced(client, n: int, rate: float, confirm_us: list[float]) -> None:  # type: ignore[no-untyped-def]
    """``n`` messages at ``rate`` per second, each carrying its send time; confirmations'
    latencies go to ``confirm_us``. Sleeps, never spins: a spinning thread holds the GIL
    and starves the client's I/O thread (and an embedded dispatcher) for a whole switch
    interval (5 ms)."""
    payload = b"x" * 128
    futures = []
    for _ in publish_times(n, rate):
        sent = time.time_ns()
        f = client.publish_async(QUEUE, sent.to_bytes(8, "big") + payload[8:])
        f.add_done_callback(lambda _f, s=sent: confirm_us.append((time.time_ns() - s) / 1000))
        futures.append(f)
    for f in futures:
        f.result(60)


def publish_times(n: int, rate: float):  # type: ignore[no-untyped-def]
    """Yield ``n`` times at ``rate`` per second; sleeps, never spins."""
    interval = 1e9 / rate
    first = time.time_ns()
    for i in range(n):
        left = first + i * interval - time.time_ns()
        if left > 0:
            time.sleep(left / 1e9)
        yield i


CONSUMERS = {
    "worker": "zq.Worker, batches (get_many / ack_many)",
    "client": "zq.Client, one at a time (get / ack)",
    "client-batches": "zq.Client, batches (get_many / ack_many)",
    # A pipeline stage: one output per input (docs/protocol.md §7.9), to topic OUT.
    "worker-publish-then-ack": "zq.Worker + zq.Publisher, batches (publish_many the outputs, then ack_many)",
    "worker-tx": "zq.Worker, batches in one commit (commit(messages, outputs))",
    "worker-tx-each": "zq.Worker, one commit per message, each waited for (msg.ack(publish=...))",
    "worker-tx-pipelined": "zq.Worker, one commit per message, not waited for (msg.ack(publish=..., wait=False))",
}
OUT = "bench.out"  # where a pipeline stage's outputs go (a queue nobody consumes)


def worker(endpoint: str, backlog: int, out: str, consumer: str = "worker") -> None:
    """A worker process: ``zq.Worker`` (single-threaded, the socket read in this
    thread) taking what has arrived at once, as a Redis worker's XREADGROUP COUNT +
    XACK; or ``zq.Client`` (an I/O thread) one message at a time, or in batches."""
    from zq.client import Client
    from zq.client.worker import Worker

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    count, last_ack, latencies = 0, 0, []
    name = f"bench-worker-{os.getpid()}"
    publisher = None
    if consumer.startswith("worker"):
        sub = Worker(endpoint, QUEUE, max_backlog=backlog, name=name)
        client = None
        take, settle = (lambda: sub.get_many(backlog, timeout=0.1)), sub.ack_many
        if consumer == "worker-publish-then-ack":
            from zq.client.publisher import Publisher

            publisher = Publisher(endpoint)

            def settle(ms: list) -> None:  # type: ignore[misc]
                publisher.publish_many(OUT, [m.data for m in ms])  # type: ignore[union-attr]
                sub.ack_many(ms)
        elif consumer == "worker-tx":
            def settle(ms: list) -> None:  # type: ignore[misc]
                if not sub.commit(ms, [(OUT, m.data) for m in ms]).committed:
                    raise RuntimeError("a transaction was not committed")
        elif consumer == "worker-tx-pipelined":
            def settle(ms: list) -> None:  # type: ignore[misc]
                for m in ms:
                    m.ack(publish=[(OUT, m.data)], wait=False)
        elif consumer == "worker-tx-each":
            def settle(ms: list) -> None:  # type: ignore[misc]
                for m in ms:
                    if m.ack(publish=[(OUT, m.data)]) != "ok":
                        raise RuntimeError("a transaction was not committed")
    else:
        client = Client(endpoint, name=name)
        sub = client.subscribe(QUEUE, max_backlog=backlog)
        if consumer == "client-batches":
            take, settle = (lambda: sub.get_many(backlog, timeout=0.1)), sub.ack_many
        else:
            take, settle = (lambda: [m for m in [sub.get(timeout=0.1)] if m is not None]), (lambda ms: ms[0].ack())
    try:
        while not stop:
            msgs = take()
            if not msgs:
                continue
            now = time.time_ns()
            for msg in msgs:
                if msg.data != b"warm-up":
                    sent = int.from_bytes(msg.data[:8], "big")
                    if sent > 1_000_000_000_000_000_000:  # a paced message carries its send time
                        latencies.append((now - sent) / 1000)
            settle(msgs)
            count += len(msgs)
            last_ack = now
    finally:
        sub.close()
        if client is not None:
            client.close()
        if publisher is not None:
            publisher.close()
    Path(out).write_text(json.dumps({"count": count, "last_ack_ns": last_ack, "latencies_us": latencies}))


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "producer":
        producer(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
    elif role == "worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else "worker")
