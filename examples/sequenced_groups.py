"""Sequenced message groups: each customer's orders are processed in order, one at a
time, while different customers are processed in parallel (Apache Qpid's groups).

    python examples/sequenced_groups.py [--endpoint tcp://127.0.0.1:7780] [--customers 6] [--orders 20]

Needs a running dispatcher. Messages published with ``group=`` carry the ``group``
header; a queue's default ``group_policy`` is ``sequenced`` (Qpid's QIP): the worker
holding a group takes its next messages, in order, up to its backlog; nobody else gets
any of that group until the holder holds none of it. At the end it deletes its queue.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import zq

QUEUE = "orders.example"


def worker(endpoint: str, log: list[tuple[str, int, str, float, float]], lock: threading.Lock,
           stop: threading.Event, name: str) -> None:
    with zq.Worker(endpoint, QUEUE, max_backlog=4, name=name) as w:
        while not stop.is_set():
            msg = w.get(timeout=0.1)
            if msg is None:
                continue
            started = time.monotonic()
            time.sleep(0.002)  # the work: slow enough that a group could run in parallel if allowed
            with lock:
                log.append((msg.group or "", int(msg.data), name, started, time.monotonic()))
            msg.ack()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default=os.environ.get("ZQ_ENDPOINT", zq.wire.DEFAULT_ENDPOINT))
    parser.add_argument("--customers", type=int, default=6)
    parser.add_argument("--orders", type=int, default=20)
    args = parser.parse_args()
    log: list[tuple[str, int, str, float, float]] = []
    lock, stop = threading.Lock(), threading.Event()
    workers = [threading.Thread(target=worker, args=(args.endpoint, log, lock, stop, f"w{i}")) for i in range(3)]
    for t in workers:
        t.start()
    total = args.customers * args.orders
    with zq.connect(args.endpoint) as c:
        for n in range(args.orders):  # interleaved: customer 0's order n, customer 1's order n, ...
            for k in range(args.customers):
                c.publish_async(QUEUE, str(n), group=f"customer-{k}")
        deadline = time.monotonic() + 60
        while len(log) < total and time.monotonic() < deadline:
            time.sleep(0.05)
    stop.set()
    for t in workers:
        t.join()
    with zq.connect(args.endpoint) as c:
        c.delete_queue(QUEUE)  # leave the dispatcher as we found it
    ok = len(log) == total
    for k in range(args.customers):
        mine = sorted((e for e in log if e[0] == f"customer-{k}"), key=lambda e: e[3])
        in_order = [e[1] for e in mine] == list(range(args.orders))
        one_at_a_time = all(a[4] <= b[3] for a, b in zip(mine, mine[1:]))
        ok &= in_order and one_at_a_time
        print(f"customer-{k}: {len(mine)} orders, in order: {in_order}, one at a time: {one_at_a_time}, "
              f"by workers {sorted({e[2] for e in mine})}")
    print("every customer's orders in order" if ok else "ORDER BROKEN")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
