"""zq embedded in the process that produces the work (the trading / analytics shape).

    python examples/embedded_dispatcher.py [--ticks 1000]

No `zq serve`: a `zq.Dispatcher` runs on a background thread of this process, with a
journal in a temporary directory. The producer publishes price ticks on the direct
path (`zq.Publisher(d)`: its thread steps the dispatcher itself, no socket); pricing
workers run as threads here, also direct (`zq.Worker(d, ...)`), and one more in
another process could connect to `d.endpoint` over tcp. Each tick is priced once;
ticks of one instrument are priced in order (a message group per instrument).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading

import zq


def pricer(target: object, priced: list[tuple[str, int]], lock: threading.Lock, stop: threading.Event) -> None:
    with zq.Worker(target, "ticks", max_backlog=32, name="pricer") as w:
        while not stop.is_set():
            msg = w.get(timeout=0.1)
            if msg is None:
                continue
            tick = json.loads(msg.data)
            with lock:
                priced.append((tick["sym"], tick["n"]))
            msg.ack()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ticks", type=int, default=1000)
    args = parser.parse_args()
    symbols = ["AAPL", "MSFT", "NVDA", "TSLA"]
    with tempfile.TemporaryDirectory() as data:
        # bind: tcp for workers in other processes; threads here take the direct path.
        config = zq.Config(data=data, bind=["tcp://127.0.0.1:0"], durability="batch")
        with zq.Dispatcher(config) as d:
            priced: list[tuple[str, int]] = []
            lock, stop = threading.Lock(), threading.Event()
            pricers = [threading.Thread(target=pricer, args=(d, priced, lock, stop)) for _ in range(2)]
            for t in pricers:
                t.start()
            with zq.Publisher(d) as pub:  # direct: this thread journals and hands over; no hop
                for n in range(args.ticks):
                    sym = symbols[n % len(symbols)]
                    pub.publish("ticks", json.dumps({"sym": sym, "n": n}), group=sym)  # returns once journaled
            with zq.connect(d.inproc) as c:  # a zq.Client reaches it over inproc
                while c.stats()["queues"]["ticks"]["acked"] < args.ticks:
                    threading.Event().wait(0.05)
            stop.set()
            for t in pricers:
                t.join()
    in_order = all(a[1] < b[1] for s in symbols for a, b in zip(
        [p for p in priced if p[0] == s], [p for p in priced if p[0] == s][1:]))
    print(f"priced {len(priced)} ticks of {len(symbols)} instruments; "
          f"each instrument in order: {in_order}; also reachable at {d.endpoint}")
    return 0 if len(priced) == args.ticks and in_order else 1


if __name__ == "__main__":
    sys.exit(main())
