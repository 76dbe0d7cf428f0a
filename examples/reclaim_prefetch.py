"""Idle workers take the work a stuck one has not started (reclaimable subscriptions).

    python examples/reclaim_prefetch.py [--endpoint tcp://127.0.0.1:7780] [--jobs 16] [--long 1.0]

Needs a running dispatcher. Two workers prefetch up to 16 jobs each; the first job
is long, the rest short. The worker that drew the long job sits on its prefetched
short ones; with ``reclaimable=True`` the dispatcher takes back those it has not
started and the idle worker does them. Run it and compare how long the short jobs
waited, plain and reclaimable. Each run deletes its queue at the end.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import zq


def run(endpoint: str, queue: str, jobs: int, long_s: float, reclaimable: bool) -> tuple[float, dict[str, int]]:
    """The longest wait of a short job (seconds) and how many jobs each worker did."""
    done_by: dict[str, int] = {"a": 0, "b": 0}
    waits: list[float] = []
    finished = threading.Event()
    lock = threading.Lock()
    with zq.connect(endpoint) as a, zq.connect(endpoint) as b:
        subs = {"a": a.subscribe(queue, max_backlog=16, reclaimable=reclaimable),
                "b": b.subscribe(queue, max_backlog=16, reclaimable=reclaimable)}

        def work(name: str) -> None:
            deadline = time.monotonic() + 60  # bounded
            while not finished.is_set() and time.monotonic() < deadline:
                msg = subs[name].get(0.05)
                if msg is None:
                    continue
                started = time.time()
                time.sleep(float(msg.headers["seconds"]))
                msg.ack()
                with lock:
                    if msg.data == b"short":
                        waits.append(started - float(msg.headers["sent"]))
                    done_by[name] += 1
                    if sum(done_by.values()) == jobs:
                        finished.set()

        threads = [threading.Thread(target=work, args=(n,)) for n in subs]
        for t in threads:
            t.start()
        sent = str(time.time())
        a.publish(queue, b"long", headers={"seconds": str(long_s), "sent": sent})
        a.publish_many(queue, [b"short"] * (jobs - 1), headers={"seconds": "0.01", "sent": sent})
        finished.wait(60)
        finished.set()
        for t in threads:
            t.join(10)
        for sub in subs.values():
            sub.close()
        a.delete_queue(queue)  # leave the dispatcher as we found it
    return max(waits), done_by


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default=os.environ.get("ZQ_ENDPOINT", zq.wire.DEFAULT_ENDPOINT))
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--long", type=float, default=1.0, help="seconds the long job takes")
    args = parser.parse_args()
    tag = str(os.getpid())
    plain, _ = run(args.endpoint, f"thumbs.plain.{tag}", args.jobs, args.long, False)
    reclaimed, by = run(args.endpoint, f"thumbs.reclaim.{tag}", args.jobs, args.long, True)
    print(f"plain prefetch: the short jobs waited up to {plain:.2f} s behind the long one")
    print(f"reclaimable:    up to {reclaimed:.2f} s (jobs done: worker a {by['a']}, worker b {by['b']})")
    print(f"short jobs no longer wait for the long one: {reclaimed < plain}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
