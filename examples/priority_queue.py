"""A priority queue: the most urgent waiting message goes first, oldest first within a
priority.

    python examples/priority_queue.py [--endpoint tcp://127.0.0.1:7780]

Needs a running dispatcher. The queue is declared at run time (journaled: it would
come back after a restart) with ``priority = "priority"``, the header that
``publish(..., priority=N)`` sets; any expression works, e.g. ``"/price * /qty"``. At
the end the example deletes it.
"""

from __future__ import annotations

import argparse
import os
import sys

import zq

QUEUE = "tickets.example"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default=os.environ.get("ZQ_ENDPOINT", zq.wire.DEFAULT_ENDPOINT))
    args = parser.parse_args()
    with zq.connect(args.endpoint) as c:
        if QUEUE not in {q["name"] for q in c.queues()}:
            c.create_queue(QUEUE, priority="priority")
        for text, urgency in [("printer jammed", 1), ("coffee machine empty", 2), ("site down", 9),
                              ("typo on a page", 0), ("payments failing", 9), ("slow laptop", 2)]:
            c.publish(QUEUE, text, priority=urgency)
        # Nobody was subscribed while they arrived: now they are handed out by priority.
        with zq.Worker(args.endpoint, QUEUE, max_backlog=1) as w:
            order = []
            for _ in range(6):
                msg = w.get(timeout=10)
                assert msg is not None, "a ticket went missing"
                order.append((int(msg.headers["priority"]), msg.data.decode()))
                msg.ack()
        c.delete_queue(QUEUE)  # leave the dispatcher as we found it
    for urgency, text in order:
        print(f"{urgency}  {text}")
    ranked = [u for u, _ in order] == sorted((u for u, _ in order), reverse=True)
    fifo_within = [t for u, t in order if u == 9] == ["site down", "payments failing"]
    print("highest first, oldest first within a priority" if ranked and fifo_within else "WRONG ORDER")
    return 0 if ranked and fifo_within else 1


if __name__ == "__main__":
    sys.exit(main())
