"""Scale scenarios: memory per queued message, and recovery time from a big journal."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from bench.e2e import child_env, free_port
from zq.core import records as R


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def server_memory(n: int, size: int = 128) -> dict:
    """A real `zq serve`, N messages published with no consumers: RSS growth per message.

    RSS also counts the journal pages the OS has mapped in for this process, so it is
    reported next to (not instead of) the engine's heap growth (`engine-memory`).
    """
    tmp = tempfile.mkdtemp(prefix="zq-mem-")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    srv = subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--data", f"{tmp}/j", "--bind", endpoint,
                            "--durability", "none"], env=child_env(), stderr=subprocess.DEVNULL)
    try:
        from zq.client import Client

        with Client(endpoint, connect_timeout=30) as c:
            c.publish("mem", b"x")
            before = rss_bytes(srv.pid)
            payload = b"x" * size
            pending = []
            for i in range(0, n, 1024):
                pending += c.publish_many_async("mem", [payload] * min(1024, n - i))
                if len(pending) > 32:
                    pending.pop(0).result(600)
            for f in pending:
                f.result(600)
            depth = c.stats()["queues"]["mem"]["depth"]
        after = rss_bytes(srv.pid)
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(120)
        shutil.rmtree(tmp, ignore_errors=True)
    return {"queued": n, "payload_bytes": size, "depth": depth, "rss_growth_bytes_per_message": round((after - before) / n, 1)}


def build_journal(path: str, total: int, unacked: int, size: int = 128) -> None:
    """A journal as a long-running server leaves it: ``total`` messages on queue
    ``jobs``, all but the last ``unacked`` acknowledged (in order, so the queue's
    recovery point sits at the first unacknowledged one)."""
    from zq.journal.lmdb_journal import LmdbJournal

    import msgspec

    from zq.core.settings import auto_queue

    j = LmdbJournal(path, durability="none")
    j.append([R.QueueDeclared(msgspec.json.encode(auto_queue("jobs", 0)), 0)])  # as auto-creation records it
    payload = b"x" * size
    chunk = 100_000
    for start in range(1, total + 1, chunk):
        j.append([R.Message(seq, 0, "jobs", {}, payload) for seq in range(start, min(start + chunk, total + 1))])
        j.commit()
    first_unacked = total - unacked + 1
    seq = total + 1
    for start in range(1, first_unacked, 65_536):  # acked events (as the server batches them)
        stop = min(start + 65_536, first_unacked)
        j.append([R.Event(seq, 0, R.ACKED, "jobs", "w", list(range(start, stop)), [1] * (stop - start))])
        seq += 1
        if seq % 16 == 0:
            j.commit()
    j.append([R.RecoveryPoint("jobs", first_unacked, 0)])
    j.commit()
    j.sync()
    j.close()


def recovery(total: int, unacked: int) -> dict:
    """Time from `zq serve` start to serving (HELLO answered) and the queue rebuilt."""
    from zq.client import Client

    tmp = tempfile.mkdtemp(prefix="zq-rec-")
    t0 = time.monotonic()
    build_journal(f"{tmp}/j", total, unacked)
    built = time.monotonic() - t0
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    start = time.monotonic()
    srv = subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--data", f"{tmp}/j", "--bind", endpoint],
                           env=child_env(), stderr=subprocess.PIPE, text=True)
    try:
        line = srv.stderr.readline()  # printed once the journal is recovered and the socket bound
        serving = time.monotonic() - start
        assert "serving on" in line, line
        with Client(endpoint, connect_timeout=60) as c:
            depth = c.stats()["queues"]["jobs"]["depth"]
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(120)
        size = sum(os.path.getsize(os.path.join(f"{tmp}/j", f)) for f in os.listdir(f"{tmp}/j"))
        shutil.rmtree(tmp, ignore_errors=True)
    assert depth == unacked, f"recovered {depth} waiting messages, expected {unacked}"
    return {"journaled": total, "unacked": unacked, "recovered_depth": depth, "journal_mib": round(size / 2**20),
            "seconds_to_serving": round(serving, 2), "seconds_to_build_journal": round(built, 1)}
