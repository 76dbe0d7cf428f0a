"""A chaos harness: real processes, a seeded schedule of faults, and a checker.

Theory of operation
-------------------
A real ``zq serve`` (its journal on a small tmpfs where the machine allows mounting
one), publisher processes and a fleet of worker processes run on this host. Three
queues carry the work: ``plain`` (no groups), ``seq`` (sequenced groups) and ``excl``
(exclusive groups), with a short lease so that a stopped worker loses its leases.

A seeded schedule injects one fault at a time: SIGKILL and restart of the server,
SIGKILL of a worker, SIGSTOP of a worker past its lease then SIGCONT, a worker slowed
past its lease, SIGKILL of a publisher mid-batch, and the journal's file system filled
to the last byte for a while. Then the faults stop, the fleet drains the queues, and
everything stops. (A read-only journal cannot be staged here: Linux refuses to remount
a file system read-only while the server holds the journal open for writing, and root
ignores permission bits. A full disk takes the same path: every commit fails.)

The checker trusts only what is durable and what publishers were told:
* the publishers' logs: every bookmark they had confirmed;
* the journal (read after the run): messages, and the delivery events in commit order.
Server restarts are marked by the journal's end before each restart, so leases held
by a dead server end there. It reports a violation when
* a confirmed message is neither acknowledged nor dead-lettered after the drain (lost);
* a message is leased again after it was acknowledged;
* a message is delivered again (deliveries > 1) without its earlier lease having
  ended by expiry, a return (its worker died or left) or a server restart;
* two consumers hold messages of one group at once, or a group's message is leased
  while an earlier one of the group waits (order), for both group policies.

``python -m zq.testing.chaos --faults 800`` is the long run (docs/reliability.md).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

QUEUES = ("plain", "seq", "excl")
GROUPS = 12
LEASE_S = 2
CONFIG = """
[server]
heartbeat = "500ms"
heartbeat_liveness = 4

[[queue]]
name = "plain"
lease = "{lease}s"
max_deliveries = 0

[[queue]]
name = "seq"
lease = "{lease}s"
max_deliveries = 0
group_policy = "sequenced"

[[queue]]
name = "excl"
lease = "{lease}s"
max_deliveries = 0
group_policy = "exclusive"
"""


# ---------------------------------------------------------------- processes


def publisher_main(endpoint: str, log_path: str, prefix: str, rate: float) -> None:
    """Publish batches of one group to each queue's topic; log what was confirmed."""
    from zq.client import ConnectionLost
    from zq.core.errors import ZqError
    from zq.client.publisher import Publisher

    rng = random.Random(prefix)
    log = open(log_path, "a", buffering=1)
    p = Publisher(endpoint, name=f"chaos-pub {prefix}", connect_timeout=60)
    n = 0
    while True:
        topic = QUEUES[n % len(QUEUES)]
        group = f"g{rng.randrange(GROUPS)}"
        batch = [f"{prefix}-{n + i}".encode() for i in range(10)]
        try:
            bookmarks = p.publish_many(topic, batch, group=None if topic == "plain" else group, timeout=30)
        except (ConnectionLost, ZqError, TimeoutError) as exc:
            print(f"publisher {prefix}: {exc}", file=sys.stderr)
            time.sleep(0.2)
            continue
        log.write("".join(f"{b} {topic}\n" for b in bookmarks))
        n += len(batch)
        time.sleep(len(batch) / rate)


def worker_main(endpoint: str, queue: str, slow: float, seed: int) -> None:
    """Ack everything; with ``slow``, sometimes hold a message past its lease."""
    from zq.client.worker import Worker

    rng = random.Random(seed)
    w = Worker(endpoint, queue, max_backlog=8, name=f"chaos-{queue}", connect_timeout=60)
    while True:
        for m in w.get_many(8, timeout=0.5):
            if slow and rng.random() < slow:
                time.sleep(LEASE_S + 0.5)  # past the lease, inside the dead-peer window
                w.heartbeat()
            m.ack()


# ---------------------------------------------------------------- the run


@dataclass
class Figures:
    seed: int
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    confirmed: int = 0
    acked: int = 0
    dead_lettered: int = 0
    redeliveries: int = 0
    restarts: int = 0
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        return (f"seed={self.seed} faults={sum(self.faults.values())} ({faults}) confirmed={self.confirmed} "
                f"acked={self.acked} dead_lettered={self.dead_lettered} redeliveries={self.redeliveries} "
                f"violations={len(self.violations)} seconds={self.seconds:.0f}")


class Chaos:
    def __init__(self, root: Path, seed: int, *, workers: int = 5, publishers: int = 2, rate: float = 400.0) -> None:
        self.root = root
        self.seed = seed
        self.rng = random.Random(seed)
        self.figures = Figures(seed)
        self.fs = root / "fs"
        self.fs.mkdir(exist_ok=True)
        self.tmpfs = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(self.fs)],
                                    capture_output=True).returncode == 0
        self.data = self.fs / "journal"
        self.endpoint = f"ipc://{root}/zq.sock"
        (root / "zq.toml").write_text(CONFIG.format(lease=LEASE_S))
        self.server: subprocess.Popen | None = None
        self.server_log = open(root / "server.log", "a")
        self.worker_queues = [QUEUES[i % len(QUEUES)] for i in range(workers)]
        self.workers: list[subprocess.Popen | None] = [None] * workers
        self.publishers: list[subprocess.Popen | None] = [None] * publishers
        self.rate = rate
        self.boundaries: list[int] = []  # the journal's next_seq before each restart
        self.spawned = 0

    # ------------------------------------------------------------ processes

    def python(self, *args: str, stderr=None) -> subprocess.Popen:  # type: ignore[no-untyped-def]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                          os.environ.get("PYTHONPATH", "")]))
        return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL,
                                stderr=stderr if stderr is not None else subprocess.DEVNULL)

    def start_server(self) -> None:
        self.server = self.python("-m", "zq.cli", "serve", "--data", str(self.data), "--bind", self.endpoint,
                                  "--config", str(self.root / "zq.toml"), stderr=self.server_log)
        from zq.client import Client

        Client(self.endpoint, connect_timeout=30).close()

    def start_worker(self, i: int) -> None:
        self.spawned += 1
        slow = "0.02" if i % 2 else "0"
        self.workers[i] = self.python("-m", "zq.testing.chaos", "worker", self.endpoint, self.worker_queues[i], slow,
                                      str(self.seed * 1000 + self.spawned))

    def start_publisher(self, i: int) -> None:
        self.spawned += 1
        prefix = f"p{i}.{self.spawned}"
        self.publishers[i] = self.python("-m", "zq.testing.chaos", "publisher", self.endpoint,
                                         str(self.root / f"pub{i}.log"), prefix, str(self.rate / len(self.publishers)))

    def journal_end(self) -> int:
        from zq.journal.lmdb_journal import LmdbJournal

        j = LmdbJournal(str(self.data), readonly=True)
        try:
            return j.next_seq()
        finally:
            j.env.close()

    # ------------------------------------------------------------ faults

    def fault(self) -> None:
        kinds = ["server-kill"] * 3 + ["worker-kill"] * 3 + ["worker-stop"] * 2 + ["publisher-kill"]
        if self.tmpfs:
            kinds += ["disk-full"] * 2
        kind = self.rng.choice(kinds)
        self.figures.faults[kind] += 1
        if kind == "server-kill":
            assert self.server is not None
            self.server.send_signal(signal.SIGKILL)
            self.server.wait(30)
            self.boundaries.append(self.journal_end())
            with open(self.root / "boundaries", "a") as f:  # so the check can be run again (--check DIR)
                f.write(f"{self.boundaries[-1]}\n")
            self.figures.restarts += 1
            self.start_server()
        elif kind == "worker-kill":
            i = self.rng.randrange(len(self.workers))
            kill(self.workers[i])
            self.start_worker(i)
        elif kind == "worker-stop":
            proc = self.workers[self.rng.randrange(len(self.workers))]
            assert proc is not None
            proc.send_signal(signal.SIGSTOP)
            time.sleep(LEASE_S + 0.5)  # its leases expire; the dispatcher may also declare it dead
            proc.send_signal(signal.SIGCONT)
        elif kind == "publisher-kill":
            i = self.rng.randrange(len(self.publishers))
            kill(self.publishers[i])
            self.start_publisher(i)
        elif kind == "disk-full":
            filler = self.fs / "filler"
            try:
                with open(filler, "wb") as f:
                    while True:
                        f.write(b"\0" * (1 << 20))
            except OSError:
                pass
            time.sleep(self.rng.uniform(0.5, 2.0))
            filler.unlink()

    def run(self, faults: int, time_limit: float = 3000.0) -> Figures:
        started = time.monotonic()
        try:
            self.start_server()
            for i in range(len(self.workers)):
                self.start_worker(i)
            for i in range(len(self.publishers)):
                self.start_publisher(i)
            stop_at = started + time_limit
            for _ in range(faults):
                if time.monotonic() > stop_at:
                    self.figures.violations.append(f"time limit: only {sum(self.figures.faults.values())} faults")
                    break
                time.sleep(self.rng.uniform(0.3, 1.2))
                self.fault()
            for p in self.publishers:
                if p is not None:
                    p.send_signal(signal.SIGKILL)
                    p.wait(10)
            self.drain(min(120.0, max(10.0, stop_at - time.monotonic())))
        finally:
            self.stop()
        self.figures.seconds = time.monotonic() - started
        self.check()
        return self.figures

    def drain(self, timeout: float) -> None:
        """No more faults: wait (bounded) until no queue holds a message."""
        from zq.client import Client

        deadline = time.monotonic() + timeout
        with Client(self.endpoint, connect_timeout=30) as c:
            while time.monotonic() < deadline:
                qs = c.stats()["queues"]
                if all(qs[q]["depth"] == 0 and qs[q]["leased"] == 0 for q in QUEUES if q in qs):
                    return
                time.sleep(0.2)
        self.figures.violations.append(f"the queues did not drain within {timeout:.0f} s")

    def stop(self) -> None:
        for proc in [*self.workers, *self.publishers]:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(10)
                self.figures.violations.append("the server did not stop on SIGTERM within 30 s")
        self.server_log.close()

    def close(self) -> None:
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.fs)], check=False)

    # ------------------------------------------------------------ the checker

    def check(self) -> None:
        confirmed: dict[int, str] = {}
        for log in self.root.glob("pub*.log"):
            for line in log.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2:
                    confirmed[int(parts[0])] = parts[1]
        self.figures.confirmed = len(confirmed)
        self.figures.violations += check_journal(str(self.data), confirmed, self.boundaries, self.figures)


def first_waiting(members: list[int], first_left: dict, key: tuple[str, str], b: int, gone: set[int],
                  held: dict[int, str]) -> int | None:
    """The first bookmark of the group before ``b`` that is neither gone nor held."""
    i = first_left[key]
    while i < len(members) and members[i] in gone:  # gone stays gone: never looked at again
        i += 1
    first_left[key] = i
    while i < len(members) and members[i] < b:
        if members[i] not in gone and members[i] not in held:
            return members[i]
        i += 1
    return None


def kill(proc: subprocess.Popen | None) -> None:
    assert proc is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def check_journal(path: str, confirmed: dict[int, str], boundaries: list[int], figures: Figures) -> list[str]:
    """The invariants of the module docstring, over a stopped server's journal."""
    from zq.core import records as R
    from zq.journal.lmdb_journal import LmdbJournal

    out: list[str] = []
    j = LmdbJournal(path, readonly=True)
    try:
        group_of: dict[int, str | None] = {}
        topic_of: dict[int, str] = {}
        for m in j.read_messages(0):  # each record checked (checksum, bookmark)
            group_of[m.seq] = m.headers.get("group")
            topic_of[m.seq] = m.topic
        for b in confirmed:
            if b not in topic_of:
                out.append(f"confirmed bookmark {b} is not in the journal")
        events = list(j.read_events(0))
    finally:
        j.env.close()

    # Each (queue, group)'s bookmarks in order, and how far from the start all are gone:
    # the order check then looks at a few bookmarks per lease, not at the whole journal.
    members: dict[tuple[str, str], list[int]] = defaultdict(list)
    for b in sorted(topic_of):
        g = group_of.get(b)
        if g is not None:
            members[(topic_of[b], g)].append(b)
    first_left: dict[tuple[str, str], int] = defaultdict(int)
    acked: dict[str, set[int]] = defaultdict(set)
    gone: dict[str, set[int]] = defaultdict(set)  # acked or removed for good
    holder: dict[str, dict[int, str]] = defaultdict(dict)  # queue -> bookmark -> consumer holding it
    broke: dict[str, set[int]] = defaultdict(set)  # bookmarks whose last lease ended by expiry/return/restart
    bounds = sorted(boundaries)
    bi = 0
    for ev in events:
        while bi < len(bounds) and ev.seq >= bounds[bi]:  # a server restart: every lease ended there
            for q, held in holder.items():
                broke[q].update(held)
                held.clear()
            bi += 1
        q = ev.queue
        if ev.kind == R.LEASED:
            for b, d in zip(ev.bookmarks, ev.deliveries):
                if b in acked[q]:
                    out.append(f"{q}: bookmark {b} leased again (event {ev.seq}) after it was acknowledged")
                if d > 1:
                    figures.redeliveries += 1
                    if b not in broke[q]:
                        out.append(f"{q}: bookmark {b} delivered again (delivery {d}, event {ev.seq}) "
                                   "though its earlier lease never ended")
                broke[q].discard(b)
                g = group_of.get(b)
                if q != "plain" and g is not None:
                    others = {c for x, c in holder[q].items() if group_of.get(x) == g and c != ev.consumer}
                    if others:
                        out.append(f"{q}: group {g} leased to {ev.consumer[:8]} (bookmark {b}, event {ev.seq}) "
                                   f"while {sorted(others)[0][:8]} holds some of it")
                    waiting = first_waiting(members[(q, g)], first_left, (q, g), b, gone[q], holder[q])
                    if waiting is not None:
                        out.append(f"{q}: group {g}: bookmark {b} leased (event {ev.seq}) while {waiting} waits")
                holder[q][b] = ev.consumer
        elif ev.kind == R.ACKED:
            for b in ev.bookmarks:
                acked[q].add(b)
                gone[q].add(b)
                holder[q].pop(b, None)
        elif ev.kind == R.EXPIRED:
            for b in ev.bookmarks:
                gone[q].add(b)
                holder[q].pop(b, None)
                figures.dead_lettered += 1
        elif ev.kind in (R.LEASE_EXPIRED, R.RETURNED, R.CANCELLED):
            for b in ev.bookmarks:
                holder[q].pop(b, None)
                broke[q].add(b)
        if len(out) > 50:
            break
    figures.acked = sum(len(s) for s in acked.values())
    for b, topic in confirmed.items():
        if b not in gone[topic]:
            out.append(f"confirmed bookmark {b} ({topic}) was neither acknowledged nor dead-lettered: lost")
            if len(out) > 100:
                break
    return out


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "publisher":
        publisher_main(argv[1], argv[2], argv[3], float(argv[4]))
        return 0
    if argv and argv[0] == "worker":
        worker_main(argv[1], argv[2], float(argv[3]), int(argv[4]))
        return 0
    ap = argparse.ArgumentParser(description="zq's chaos harness (see the module docstring)")
    ap.add_argument("--faults", type=int, default=40)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--time-limit", type=float, default=3000.0)
    ap.add_argument("--keep", action="store_true", help="keep the run's directory (logs, journal)")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2**32)
    root = Path(tempfile.mkdtemp(prefix="zq-chaos-"))
    chaos = Chaos(root, seed)
    try:
        figures = chaos.run(a.faults, a.time_limit)
    finally:
        chaos.close()
    print(figures.line(), f"tmpfs={chaos.tmpfs}", f"dir={root}" if a.keep else "")
    for v in figures.violations[:30]:
        print("VIOLATION", v)
    return 1 if figures.violations else 0


if __name__ == "__main__":
    sys.exit(main())
