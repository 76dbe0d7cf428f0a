"""An elected cluster under faults (``python -m bench run failover`` / ``faults``).

Three `zq serve` nodes (replicas_ack = 1, heartbeats of 500 ms, a ZooKeeper session of
2 s), a real ZooKeeper (Debian's package, started here on 127.0.0.1), a publisher
(message ids, 8 groups) and a worker, both given every node's endpoint.

* ``failover``: the leader is SIGKILLed, again and again (each time started again as a
  standby once a new leader serves). Failover time = the kill -> the worker's first
  message from a new session (only the new leader delivers: the old one is dead, a
  standby never does). The worker is paced (20 ms a message) so that the queue never
  runs dry (``backlog_at_kill_min``): the figure is the cluster's and the worker's, not
  the publisher's reconnect, which is reported beside it (the kill -> the publisher's
  next confirmation).
* ``faults``: a long run of seeded random faults: the leader SIGKILLed, the leader
  paused (SIGSTOP) past its session and resumed, a standby SIGKILLed; then a checker:
  every confirmed publish processed, each group's messages first processed in order,
  how many were processed twice (at least once: what was in flight at a fault).

Every loop is bounded in count and time; nodes are stopped by their PIDs.
"""

from __future__ import annotations

import random
import signal
import tempfile
import threading
import time
from pathlib import Path

from bench.e2e import percentiles

GROUPS = 8


class Load:
    """A publisher and a paced worker on every endpoint, in threads."""

    def __init__(self, endpoints: str, pace_s: float = 0.02) -> None:
        self.endpoints, self.pace_s = endpoints, pace_s
        self.confirmed: list[str] = []
        self.confirmed_at: list[float] = []  # when each was confirmed
        self.processed: list[str] = []
        self.sessions: list[tuple[float, int]] = []  # (time of a message, the worker's session number)
        self.stop = threading.Event()
        self.publishing_stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self.publish, daemon=True),
                        threading.Thread(target=self.work, daemon=True)]
        self.worker = None

    def start(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def publish(self) -> None:
        import zq

        try:
            with zq.Publisher(self.endpoints, connect_timeout=60) as p:
                i = 0
                while not self.publishing_stop.is_set() and i < 5_000_000:
                    g = i % GROUPS
                    p.publish("jobs", f"{g}:{i}", group=f"g{g}", msg_id=f"m{i}", timeout=120)
                    self.confirmed.append(f"{g}:{i}")
                    self.confirmed_at.append(time.monotonic())
                    i += 1
        except BaseException as exc:  # noqa: BLE001 -- reported by the run
            self.errors.append(exc)

    def work(self) -> None:
        import zq

        try:
            with zq.Worker(self.endpoints, "jobs", max_backlog=8, connect_timeout=60) as w:
                self.worker = w
                while not self.stop.is_set():
                    m = w.get(0.1)
                    if m is None:
                        continue
                    self.sessions.append((time.monotonic(), m._generation))
                    self.processed.append(m.data.decode())
                    m.ack()
                    if self.pace_s:
                        time.sleep(self.pace_s)
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)

    def first_from_new_session(self, after: float, timeout: float = 60.0) -> float:
        """Seconds from ``after`` to the worker's first message of a session newer than
        the one it had then."""
        gen_then = max((g for t, g in self.sessions if t <= after), default=0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, g in reversed(self.sessions[-5000:]):
                if t > after and g > gen_then:
                    later = [t2 for t2, g2 in self.sessions if t2 > after and g2 > gen_then]
                    return min(later) - after
            time.sleep(0.01)
        raise RuntimeError(f"no message from a new session within {timeout}s")

    def first_confirm_after(self, after: float, timeout: float = 60.0) -> float:
        """Seconds from ``after`` to the publisher's next confirmation."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            later = [t for t in self.confirmed_at[-2000:] if t > after]
            if later:
                return later[0] - after
            time.sleep(0.01)
        raise RuntimeError(f"no confirmation within {timeout}s")

    def depth(self) -> int:
        return len(self.confirmed) - len(set(self.processed))

    def finish(self, timeout: float = 120.0) -> dict:
        """Stop publishing, wait until every confirmed message was processed, check."""
        self.publishing_stop.set()
        self.threads[0].join(timeout)
        self.pace_s = 0.0  # drain at full speed
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not set(self.confirmed) <= set(self.processed):
            time.sleep(0.05)
        self.stop.set()
        self.threads[1].join(30)
        return check(self.confirmed, self.processed)


def check(confirmed: list[str], processed: list[str]) -> dict:
    lost = set(confirmed) - set(processed)
    first: dict[str, list[int]] = {}
    seen: set[str] = set()
    for p in processed:
        if p not in seen:
            seen.add(p)
            g, i = p.split(":")
            first.setdefault(g, []).append(int(i))
    out_of_order = sum(1 for order in first.values() for a, b in zip(order, order[1:]) if b < a)
    return {"confirmed": len(confirmed), "processed": len(processed), "lost": len(lost),
            "twice": len(processed) - len(seen), "group_order_breaks": out_of_order}


def cluster(directory: Path, zk_hosts: str):  # type: ignore[no-untyped-def]
    from zq.testing.cluster import Cluster

    c = Cluster(directory, zk_hosts, path="/zq/bench",
                settings='[[queue]]\nname = "jobs"\nlease = "30s"\n', cluster_settings="replicas_ack = 1")
    c.start()
    c.leader(timeout=60)
    return c


def failover(kills: int) -> list[dict]:
    from zq.testing.zookeeper import ZooKeeper

    with tempfile.TemporaryDirectory(prefix="zq-bench-failover-") as tmp:
        zk = ZooKeeper(Path(tmp) / "zk").start()
        c = None
        try:
            c = cluster(Path(tmp) / "cluster", zk.hosts)
            load = Load(c.endpoints).start()
            times, confirms, depths = [], [], []
            deadline = time.monotonic() + 60 + kills * 30  # bounded: a stuck run stops itself
            while load.depth() < 300 and time.monotonic() < deadline and not load.errors:
                time.sleep(0.05)  # a backlog first: the worker must have work when the new leader serves
            for _ in range(kills):
                if load.errors or time.monotonic() > deadline:
                    break
                leader, epoch = c.leader()
                time.sleep(0.5)
                depths.append(load.depth())
                killed = time.monotonic()
                c.kill(leader)
                times.append(load.first_from_new_session(killed))
                confirms.append(load.first_confirm_after(killed))
                c.leader(other_than=leader, epoch_above=epoch)
                c.start(leader)
                time.sleep(1.5)  # the restarted node catches up before the next kill
            counts = load.finish()
            if load.errors:
                raise RuntimeError(f"load failed: {load.errors[0]!r}")
            ms = [round(t * 1000, 1) for t in times]
            cms = [round(t * 1000, 1) for t in confirms]
            return [{"scenario": "failover", "kills": len(times), "session_timeout_ms": 2000, "replicas_ack": 1,
                     "failover_ms": percentiles(ms, (50, 90, 99)), "worst_ms": max(ms), "each_ms": ms,
                     "publisher_ms": percentiles(cms, (50, 90, 99)), "publisher_each_ms": cms,
                     "backlog_at_kill_min": min(depths), **counts}]
        finally:
            if c is not None:
                c.close()
            zk.stop()


def faults(count: int, seed: int = 1) -> list[dict]:
    from zq.testing.zookeeper import ZooKeeper

    rng = random.Random(seed)
    done = {"leader_killed": 0, "leader_paused": 0, "standby_killed": 0}
    with tempfile.TemporaryDirectory(prefix="zq-bench-faults-") as tmp:
        zk = ZooKeeper(Path(tmp) / "zk").start()
        c = None
        try:
            c = cluster(Path(tmp) / "cluster", zk.hosts)
            load = Load(c.endpoints, pace_s=0.0).start()  # faults: as fast as it goes
            deadline = time.monotonic() + 60 + count * 30
            epochs = [c.leader()[1]]
            for _ in range(count):
                if load.errors or time.monotonic() > deadline:
                    break
                time.sleep(rng.uniform(0.5, 2.0))
                leader, epoch = c.leader()
                kind = rng.choice(list(done))
                if kind == "leader_killed":
                    c.kill(leader)
                    epochs.append(c.leader(other_than=leader, epoch_above=epoch)[1])
                    c.start(leader)
                elif kind == "leader_paused":
                    c.signal(leader, signal.SIGSTOP)
                    epochs.append(c.leader(other_than=leader, epoch_above=epoch)[1])
                    time.sleep(rng.uniform(0.0, 1.0))
                    c.signal(leader, signal.SIGCONT)  # fenced: it steps down and follows
                else:
                    standby = rng.choice([n for n in c.names if n != leader])
                    c.kill(standby)
                    time.sleep(rng.uniform(0.2, 1.5))
                    c.start(standby)
                done[kind] += 1
                time.sleep(2.0)  # restarted nodes catch up before the next fault
            counts = load.finish()
            if load.errors:
                raise RuntimeError(f"load failed: {load.errors[0]!r}")
            return [{"scenario": "faults", "seed": seed, **done, "epochs": len(set(epochs)), **counts,
                     "tracebacks": bool(c.tracebacks())}]
        finally:
            if c is not None:
                c.close()
            zk.stop()
