"""Claims with long polls (OpenStack Marconi's shape): pull work when you want it,
instead of holding a subscription open.

    python examples/claims_long_poll.py [--endpoint tcp://127.0.0.1:7780]

Needs a running dispatcher. ``claim(queue, wait=S)`` waits up to S seconds for at
least one message (a long poll: one request, no busy loop), leases what it takes for
``lease`` seconds, and returns it; ack, cancel or extend each as usual. A claim that
is never settled comes back to the queue when its lease ends. At the end it deletes
its queue.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import zq

QUEUE = "reports.example"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default=os.environ.get("ZQ_ENDPOINT", zq.wire.DEFAULT_ENDPOINT))
    args = parser.parse_args()
    with zq.connect(args.endpoint) as c:
        if QUEUE in {q["name"] for q in c.queues()}:
            c.purge(QUEUE)  # a clean start after a run that stopped half-way

        # 1. A long poll on an empty queue: it returns as soon as a message arrives.
        def publish_later() -> None:
            with zq.connect(args.endpoint) as other:
                other.publish(QUEUE, "report 1")

        threading.Timer(0.5, publish_later).start()
        started = time.monotonic()
        got = c.claim(QUEUE, wait=10, lease=30)
        waited = time.monotonic() - started
        print(f"long poll returned {[m.data.decode() for m in got]} after {waited:.1f} s (limit 10 s)")
        for m in got:
            m.ack()

        # 2. A batch claim: up to 10 at once, leased for 2 s.
        c.publish_many(QUEUE, [f"report {i}" for i in range(2, 7)])
        batch = c.claim(QUEUE, limit=10, wait=5, lease=2)
        print(f"claimed {len(batch)} in one request")
        batch[0].extend(30)  # needs longer: only this one's lease grows
        for m in batch[1:]:
            m.ack()
        batch[0].ack()

        # 3. Nothing there: an empty answer after the wait, not an error.
        empty = c.claim(QUEUE, wait=0.2)
        print(f"an empty queue answers {empty} after the wait")
        c.delete_queue(QUEUE)  # leave the dispatcher as we found it
    ok = len(got) == 1 and waited < 10 and len(batch) == 5 and empty == []
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
