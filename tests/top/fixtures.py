"""Two recorded stats snapshots one second apart (shape of the server's STATS reply)."""

BUCKETS = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000]


def snapshot(published, acked, depth, counts, sub_acked, busy_ms, uptime_ms):
    return {
        "server": {"version": "zq/0.1.0", "uptime_ms": uptime_ms, "durability": "batch", "journal_bytes": 5 * 2**20,
                   "journal_map_bytes": 2**40, "rates": {"publish": 1200.0, "deliver": 1100.0, "ack": 1100.0},
                   "publishers": 1, "workers": 2},
        "queues": {
            "jobs": {"depth": depth, "leased": 12, "published": published, "acked": acked, "redelivered": 3, "lost": 2, "delayed": 5,
                     "expired": 1, "dead_lettered": 1, "delivered": acked + 12, "cancelled": 2, "groups": 0,
                     "oldest_ms": 1500, "oldest_bookmark": 4711, "semantics": "at-least-once",
                     "ack_latency": {"buckets_ms": BUCKETS, "counts": counts, "sum_ms": 0},
                     "consumers": [
                         {"sub": "a/s1", "consumer": "a", "name": "host:101", "used": 8, "backlog": 16,
                          "acked": sub_acked[0], "busy_ms": busy_ms[0], "heard_ms_ago": 200},
                         {"sub": "b/s1", "consumer": "b", "name": "host:102 slow", "used": 4, "backlog": 16,
                          "acked": sub_acked[1], "busy_ms": busy_ms[1], "heard_ms_ago": 900,
                          "reclaimable": True, "given_back": 1200},
                     ]},
            "orders": {"depth": 40, "leased": 2, "published": 40, "acked": 0, "redelivered": 0, "expired": 0,
                       "dead_lettered": 0, "delivered": 2, "cancelled": 0, "groups": 7, "oldest_ms": None,
                       "semantics": "at-least-once",
                       "ack_latency": {"buckets_ms": BUCKETS, "counts": [0] * 16, "sum_ms": 0}, "consumers": [],
                       "group_summary": {"count": 7, "in_flight": 2, "scanned": 7,
                                         "busiest": [{"group": "acme", "pending": 30, "owner": None}]}},
        },
    }


PREV = snapshot(1000, 900, 100, [0, 0, 100, 400, 300, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], (500, 400), (5000, 40000), 10_000)
CURR = snapshot(2200, 2000, 200, [0, 0, 200, 900, 700, 280, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0], (1100, 900), (11000, 90000), 11_000)


IDLE = ["audit-log", "billing", "emails", "exports", "images", "invoices", "reports", "search-index", "sms", "webhooks"]


def _queue(depth, published, acked, leased=0, consumers=(), oldest_ms=None):
    return {"depth": depth, "leased": leased, "published": published, "acked": acked, "redelivered": 0, "lost": 0,
            "delayed": 0, "expired": 0, "dead_lettered": 0, "delivered": acked + leased, "cancelled": 0, "groups": 0,
            "oldest_ms": oldest_ms, "oldest_bookmark": 1 if depth else None, "semantics": "at-least-once",
            "ack_latency": {"buckets_ms": BUCKETS, "counts": [0] * 16, "sum_ms": 0}, "consumers": list(consumers)}


def fleet_snapshot(t: int, idle=IDLE):
    """A busy queue with big numbers (``t`` seconds in: 12,345 in/s, 11,000 out/s, a deep
    backlog) and two workers, beside ``idle`` queues that hold a few messages and move not."""
    workers = [{"sub": f"w{i}/s1", "consumer": f"w{i}", "name": f"vm:{4100 + i} test-ack", "used": 16, "backlog": 16,
                "acked": 5500 * t, "busy_ms": 4 * 5500 * t, "heard_ms_ago": 3} for i in range(2)]
    queues = {"jobs": _queue(1_234_567 + 1345 * t, 12_345 * t, 11_000 * t, leased=32, consumers=workers, oldest_ms=98_000)}
    for i, name in enumerate(idle):
        queues[name] = _queue(i + 1, i + 1, 0, oldest_ms=60_000)
    return {"server": {"version": "zq/0.1.0", "uptime_ms": 1000 * t, "durability": "batch", "journal_bytes": 2**30,
                       "journal_map_bytes": 2**40, "rates": {"publish": 12_345.0, "deliver": 11_000.0, "ack": 11_000.0},
                       "publishers": 1, "workers": 2},
            "queues": queues}
