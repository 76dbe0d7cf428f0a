"""A worker fleet with zq.Worker, and a graceful shutdown.

    python examples/worker_fleet.py [--endpoint tcp://127.0.0.1:7780] [--jobs 300] [--workers 3]

Needs a running dispatcher (`zq serve`). The script starts worker processes, waits
until the dispatcher counts every one of them as a consumer of the queue, publishes
the jobs (so they are shared out: published before the workers subscribe, the first
one to arrive would take them all), waits until every job is acknowledged, then sends
each worker SIGTERM: a worker finishes the message in hand, acknowledges it and
leaves. Nothing is lost on the way out: a worker that dies instead (SIGKILL) has its
leases broken by the dispatcher, and its messages go to the others. At the end it
deletes its queue from the dispatcher.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import zq

QUEUE = "fleet.jobs"


def work(endpoint: str, name: str) -> int:
    """One worker process: consume until SIGTERM, then finish the current message."""
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True  # checked between messages: the one in hand is finished first

    signal.signal(signal.SIGTERM, stop)
    done = 0
    with zq.Worker(endpoint, QUEUE, max_backlog=8, name=name) as w:
        print("ready", flush=True)
        while not stopping:
            msg = w.get(timeout=0.2)  # a short timeout: the loop notices SIGTERM promptly
            if msg is None:
                continue
            int(msg.data)  # "the work"
            msg.ack()
            done += 1
    # Leaving the with-block says BYE: anything still prefetched goes back to the queue.
    print(f"{name}: did {done} jobs, stopped cleanly", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default=os.environ.get("ZQ_ENDPOINT", zq.wire.DEFAULT_ENDPOINT))
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # set in the worker processes
    args = parser.parse_args()
    if args.worker:
        return work(args.endpoint, args.worker)

    with zq.connect(args.endpoint) as c:
        fleet = [subprocess.Popen([sys.executable, __file__, "--endpoint", args.endpoint, "--worker", f"w{i}"],
                                  stdout=subprocess.PIPE, text=True) for i in range(args.workers)]
        try:
            for p in fleet:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            wait_for_consumers(c, args.workers)  # every worker subscribed: now the jobs are shared out
            acked_before = c.stats()["queues"][QUEUE]["acked"]
            c.publish_many(QUEUE, [str(i) for i in range(args.jobs)])
            deadline = time.monotonic() + 60
            while c.stats()["queues"][QUEUE]["acked"] - acked_before < args.jobs:  # bounded wait
                if time.monotonic() > deadline:
                    raise SystemExit("the fleet did not finish in 60 s")
                time.sleep(0.1)
        finally:
            for p in fleet:
                p.send_signal(signal.SIGTERM)  # graceful: each finishes what it holds
            codes = [p.wait(timeout=30) for p in fleet]
            c.delete_queue(QUEUE)  # leave the dispatcher as we found it
        for p in fleet:
            print(p.stdout.read().strip())  # type: ignore[union-attr]
    print(f"{args.jobs} jobs done by {args.workers} workers; exit codes {codes}")
    return 0 if codes == [0] * args.workers else 1


def wait_for_consumers(c: zq.Client, n: int, timeout: float = 30.0) -> None:
    """Until the dispatcher's stats count ``n`` consumers on the queue (bounded)."""
    deadline = time.monotonic() + timeout
    while len(c.stats()["queues"].get(QUEUE, {}).get("consumers", [])) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"only some of the {n} workers subscribed within {timeout:g} s")
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
