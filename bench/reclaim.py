"""Prefetch behind a long job, with and without reclaiming (``python -m bench run reclaim``).

The complaint Celery, Dramatiq and Pulsar users share: a worker that prefetched a
batch and then hit one long job sits on the rest while another worker has nothing to
do. Two workers (``zq.connect``, backlog 16) subscribe; a burst of jobs is published,
the first one long and the rest short; each worker sleeps for its job's time, then
acks. Figures per case: the short jobs' wait (publish -> a worker starts them) and the
makespan (publish -> the last ack), plain and ``reclaimable=True``, interleaved round
by round in one invocation against one real `zq serve` over tcp loopback.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time

from bench.e2e import child_env, free_port, percentiles

BACKLOG = 16


def run_case(endpoint: str, queue: str, jobs: int, long_ms: int, short_ms: int, reclaimable: bool) -> dict:
    import zq

    subs, clients = [], []
    for i in range(2):
        c = zq.connect(endpoint, name=f"bench-{i}")
        clients.append(c)
        subs.append(c.subscribe(queue, max_backlog=BACKLOG, reclaimable=reclaimable))
    starts: dict[int, float] = {}
    done = threading.Event()
    acked = [0]
    lock = threading.Lock()
    t_end = [0.0]

    def work(sub) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 60  # bounded: a stuck run stops itself
        while not done.is_set() and time.monotonic() < deadline:
            msg = sub.get(0.05)
            if msg is None:
                continue
            with lock:
                starts[msg.bookmark] = time.perf_counter()
            time.sleep(int(msg.headers["ms"]) / 1000)
            msg.ack()
            with lock:
                acked[0] += 1
                if acked[0] == jobs:
                    t_end[0] = time.perf_counter()
                    done.set()

    threads = [threading.Thread(target=work, args=(s,)) for s in subs]
    for t in threads:
        t.start()
    try:
        with zq.connect(endpoint) as pub:
            t0 = time.perf_counter()
            first = pub.publish(queue, b"long", headers={"ms": str(long_ms)})
            pub.publish_many(queue, [b"short"] * (jobs - 1), headers={"ms": str(short_ms)})
        if not done.wait(60):
            raise RuntimeError(f"reclaim bench: {acked[0]} of {jobs} jobs done in 60 s")
        waits = [(at - t0) * 1e6 for b, at in starts.items() if b != first]
        reclaimed = sum(s.unstarted.released for s in subs if s.unstarted is not None)
    finally:
        done.set()
        for t in threads:
            t.join(10)
        for s in subs:
            s.close()
        for c in clients:
            c.close()
    return {"case": "reclaimable" if reclaimable else "plain prefetch", "workers": 2, "backlog": BACKLOG, "jobs": jobs,
            "long_job_ms": long_ms, "short_job_ms": short_ms, "short_wait_us": percentiles(waits),
            "short_wait_p99_ms": round(percentiles(waits)["p99"] / 1000, 1),
            "makespan_ms": round((t_end[0] - t0) * 1000, 1), "jobs_per_s": round(jobs / (t_end[0] - t0), 1),
            "given_back": reclaimed}


def compare(rounds: int, jobs: int, long_ms: int, short_ms: int) -> list[dict]:
    tmp = tempfile.mkdtemp(prefix="zq-bench-")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--data", f"{tmp}/j", "--bind", endpoint],
                              env=child_env(), stderr=subprocess.DEVNULL)
    try:
        import zq

        zq.connect(endpoint, connect_timeout=30).close()  # ready
        rows = []
        for r in range(rounds):
            for reclaimable in (False, True):
                rows.append(run_case(endpoint, f"jobs{r}{int(reclaimable)}", jobs, long_ms, short_ms, reclaimable))
        return rows
    finally:
        server.terminate()
        server.wait(30)
