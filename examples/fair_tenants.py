"""Tenants share a queue fairly: a customer who floods it does not hold back the others.

    python examples/fair_tenants.py [--endpoint tcp://127.0.0.1:7780] [--flood 200]

Needs a running dispatcher. The queue is declared at run time with
``tenant_header = "customer"`` and weights (acme pays for twice the share). "bigco"
publishes a flood first, then acme and initech a few jobs each; one worker takes them
one at a time, and the first twenty it gets are shared out by weight, not in
publish order (a plain FIFO would hand out twenty of bigco's). At the end it deletes
its queue.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

import zq

QUEUE = "renders.example"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default=os.environ.get("ZQ_ENDPOINT", zq.wire.DEFAULT_ENDPOINT))
    parser.add_argument("--flood", type=int, default=200)
    args = parser.parse_args()
    with zq.connect(args.endpoint) as c:
        if QUEUE not in {q["name"] for q in c.queues()}:
            c.create_queue(QUEUE, tenant_header="customer", tenant_weights={"acme": 2}, group_header="")
        c.publish_many(QUEUE, [b"frame"] * args.flood, headers={"customer": "bigco"})
        c.publish_many(QUEUE, [b"frame"] * 10, headers={"customer": "acme"})
        c.publish_many(QUEUE, [b"frame"] * 10, headers={"customer": "initech"})
        print("held:", ", ".join(f"{t['tenant']} {t['held']} (weight {t['weight']})"
                                 for t in c.stats()["queues"][QUEUE]["tenants"]))
        first: list[str] = []
        with zq.Worker(args.endpoint, QUEUE, max_backlog=1) as w:
            for _ in range(args.flood + 20):
                msg = w.get(timeout=10)
                assert msg is not None, "a job went missing"
                if len(first) < 20:
                    first.append(msg.headers["customer"])
                msg.ack()
        c.delete_queue(QUEUE)  # leave the dispatcher as we found it
    counts = Counter(first)
    print("first twenty:", dict(counts))
    shared = counts["acme"] >= 2 * counts["initech"] - 1 and counts["initech"] >= 4 and counts["bigco"] <= 6
    print("shared by weight (2 : 1 : 1), not by who came first" if shared else "NOT SHARED")
    return 0 if shared else 1


if __name__ == "__main__":
    sys.exit(main())
