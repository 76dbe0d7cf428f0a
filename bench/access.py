"""Access-path figures: what a filter costs per message, and a claim's round trip.

* ``filter_costs``: the compiled expression called on a 128-byte-ish JSON message with
  headers, as the engine calls it (``Compiled.fn(headers, payload, topic)``), for a
  header comparison, a two-field body filter and an arithmetic body filter; plus a
  filtered subscription's dispatch through the engine (content read included).
* ``claim_latency``: a `zq serve` over tcp loopback; one client claims one message at
  a time (messages waiting) and times each claim -> answer; then long polls that a
  publisher wakes, timed from the publish.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time

from bench.e2e import child_env, free_port, percentiles

HEADERS = {"region": "eu", "kind": "limit", "trader": "t-17"}
PAYLOAD = json.dumps({"id": "o-12345", "order": {"sym": "ABCD", "qty": 10, "price": 200.5}, "account": "acc-9",
                      "tags": ["a", "b"], "note": "x" * 20}).encode()
FILTERS = {
    "header =": "region = 'eu'",
    "two body fields": "/order/qty > 5 AND /order/price < 500",
    "body arithmetic": "/order/qty * /order/price > 1000",
}


def filter_costs(n: int) -> list[dict]:
    from zq.core.expr import compile_filter

    rows = []
    for name, text in FILTERS.items():
        fn = compile_filter(text).fn
        assert fn(HEADERS, PAYLOAD, "orders") is True
        best = None
        for _ in range(3):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn(HEADERS, PAYLOAD, "orders")
            dt = (time.perf_counter_ns() - t0) / n
            best = dt if best is None else min(best, dt)
        rows.append({"case": f"filter: {name}", "expression": text, "payload_bytes": len(PAYLOAD),
                     "ns_per_message": round(best, 1), "filters_per_s": round(1e9 / best)})
    rows.append(filtered_dispatch(n))
    return rows


def filtered_dispatch(n: int) -> dict:
    """Engine: publish n, a filtered subscriber matching half takes its share (content port = a dict)."""
    from zq.core import records as R
    from zq.core.engine import Engine

    store: dict[int, R.Message] = {}
    eng = Engine(content=store.get)
    red, blue = {"color": "red"}, {"color": "blue"}
    seqs = eng.publish_many("jobs", [(PAYLOAD, red if i % 2 else blue, None) for i in range(min(n, 4096))], 0)
    for r in eng.drain(0).records:
        if type(r) is R.Message:
            store[r.seq] = r
    del seqs
    eng.subscribe("s", "jobs", "c", 64, 0, filter="color = 'red'")
    t0 = time.perf_counter_ns()
    got = 0
    while True:
        out = eng.drain(0)
        taken = [s for d in out.deliveries for s in d.seqs]
        if not taken:
            break
        got += len(taken)
        eng.ack("s", taken, 0)
    dt = time.perf_counter_ns() - t0
    return {"case": "engine: filtered subscriber, half match", "messages": got,
            "ns_per_message": round(dt / max(got, 1), 1), "filters_per_s": round(got / (dt / 1e9))}


def claim_latency(n: int) -> list[dict]:
    from zq.client import Client

    tmp = tempfile.mkdtemp(prefix="zq-bench-")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--data", f"{tmp}/j", "--bind", endpoint],
                              env=child_env(), stderr=subprocess.DEVNULL)
    try:
        with Client(endpoint, connect_timeout=30) as c, Client(endpoint) as pub:
            pub.publish_many("work", [b"x" * 128] * n)
            rtt = []
            t_all = time.perf_counter_ns()
            for _ in range(n):
                t0 = time.perf_counter_ns()
                got = c.claim("work", limit=1, lease=30)
                rtt.append((time.perf_counter_ns() - t0) / 1000)
                got[0].ack()
            total_s = (time.perf_counter_ns() - t_all) / 1e9
            polls = max(20, n // 20)
            wake = []
            for _ in range(polls):
                sent: list[int] = []

                def publish_later() -> None:
                    time.sleep(0.002)
                    sent.append(time.perf_counter_ns())
                    pub.publish("work", b"wake")

                t = threading.Thread(target=publish_later)
                t.start()
                got = c.claim("work", limit=1, wait=5, lease=30)
                done = time.perf_counter_ns()
                t.join()
                wake.append((done - sent[0]) / 1000)
                got[0].ack()
        return [
            {"case": "claim limit=1, messages waiting", "transport": "tcp loopback", "durability": "batch",
             "claims": n, "round_trip_us": percentiles(rtt), "claims_per_s": round(n / total_s)},
            {"case": "long poll woken by a publish", "transport": "tcp loopback", "durability": "batch",
             "claims": polls, "publish_to_answer_us": percentiles(wake),
             "claims_per_s": round(polls / (sum(wake) / 1e6 + polls * 0.002))},
        ]
    finally:
        server.terminate()
        server.wait(30)
