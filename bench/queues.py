"""Idle queues: what queues nobody uses cost the ones in use.

* ``engine_step``: one engine step (advance, drain, next deadline) with N idle queues
  beside one busy one, no I/O: the fixed cost every loop iteration pays.
* ``latency``: the latency scenario's layout (``bench.e2e.latency``: a paced
  ``zq.Client`` producer at 2,000 msg/s, 4 ``zq.Worker`` processes, tcp) on a `zq serve`
  that also holds N idle queues (made with ``queue-create``, one exact topic each):
  publish -> worker percentiles and the server's CPU per message.

Until 2026-11-26 every step walked every queue (~1 us each, compiled): 10,000 idle
queues cost each iteration ~9-11 ms, and every message waited for it.
"""

from __future__ import annotations

import time

from bench.e2e import QUEUE, Fleet, cpu_seconds, percentiles, run_producer


def engine_step(counts: tuple[int, ...] = (0, 1_000, 9_999), steps: int = 300) -> list[dict]:
    from zq.core.engine import Engine
    from zq.core.settings import QueueSettings

    rows = []
    for n in counts:
        e = Engine([QueueSettings(name="busy"), *(QueueSettings(name=f"idle{i}", topics=f"^idle{i}$") for i in range(n))])
        now = 1_000_000
        e.subscribe("w", "busy", "w", 16, now)
        e.advance(now)
        e.drain(now)
        started = time.perf_counter()
        for i in range(steps):
            now += 1
            seq = e.publish("busy", b"x", None, now)
            e.advance(now)
            e.drain(now)
            e.ack("w", [seq], now)
            e.next_deadline_ms()
        took = time.perf_counter() - started
        rows.append({"case": "engine step, one publish and one ack", "idle_queues": n, "steps": steps,
                     "us_per_step": round(took / steps * 1e6, 1)})
    return rows


def latency(idle: int, seconds: float, rate: float = 2000) -> dict:
    n = int(seconds * rate)
    fleet = Fleet(4, 16, "batch")
    try:
        from zq.client import Client

        started = time.perf_counter()
        with Client(fleet.endpoint, window=1024) as c:
            for i in range(idle):
                c.create_queue(f"idle{i}", topics=f"^idle{i}$")
        made_s = time.perf_counter() - started
        cpu0 = cpu_seconds(fleet.server.pid)
        run_producer(fleet.endpoint, n, "paced", 0, rate)
        cpu1 = cpu_seconds(fleet.server.pid)
        deadline = time.monotonic() + 60 + seconds
        with Client(fleet.endpoint) as c:  # (STATS over every queue is dear: asked twice a second)
            while c.stats()["queues"][QUEUE]["acked"] < n + 1:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not every message was acked within {60 + seconds} s")
                time.sleep(0.5)
        reports = fleet.reports()
    finally:
        fleet.close()
    deliver = [x for r in reports for x in r["latencies_us"]]
    return {"case": "latency beside idle queues", "idle_queues": idle, "queues_made_s": round(made_s, 1),
            "rate": rate, "seconds": seconds, "messages": n, "publish_to_worker_us": percentiles(deliver),
            "server_cpu_us_per_msg": round((cpu1 - cpu0) / n * 1e6, 1)}


def run(quick: bool) -> list[dict]:
    if quick:
        return engine_step((0, 200), steps=50) + [latency(50, 0.5)]
    return engine_step() + [latency(n, 8.0) for n in (0, 1_000, 5_000)]
