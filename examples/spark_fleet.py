"""End to end: Spark fans work out into zq, a worker fleet does it, Spark reports.

    python examples/spark_fleet.py [--messages 2000] [--workers 3] [--out spark-fleet-report]

1. An embedded dispatcher starts (a temporary journal, tcp on 127.0.0.1).
2. A Spark job writes one message per row into topic ``work`` (grouped by customer,
   ids derived from the rows, so a retried task enqueues nothing twice).
3. Worker processes consume ``work``, square each number, publish the answer to
   ``results`` (message id ``result-<bookmark>``: a redelivered job publishes its
   answer once) and acknowledge.
4. Spark reads ``results`` and checks the sum, then reads the delivery-event log and
   writes the delivery report (Parquet, PNG, text: tools/delivery_report.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def worker(endpoint: str, name: str) -> None:
    import zq

    with zq.connect(endpoint, name=name) as c, c.subscribe("work", max_backlog=16) as sub:
        while True:
            msg = sub.get(3.0)
            if msg is None:
                return  # the work ran out
            n = json.loads(msg.data)["n"]
            c.publish_async("results", json.dumps({"n": n, "square": n * n}), msg_id=f"result-{msg.bookmark}")
            msg.ack()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Spark -> zq -> workers -> Spark report")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--out", default="spark-fleet-report")
    args = parser.parse_args(argv)

    import zq
    from tools.delivery_report import figures, load, write
    from zq.server.config import Config
    from zq.spark import local_session

    data = tempfile.mkdtemp(prefix="zq-spark-fleet-")
    d = zq.Dispatcher(Config(data=data, bind=["tcp://127.0.0.1:0"])).start()
    spark = local_session("zq-spark-fleet")
    try:
        ep = d.endpoint
        t0 = time.time()
        (spark.range(args.messages, numPartitions=2)
         .selectExpr("cast(to_json(named_struct('n', id)) as binary) as payload", "concat('cust-', id % 8) as `group`")
         .write.format("zq").option("endpoint", ep).option("topic", "work").mode("append").save())
        print(f"spark wrote {args.messages} jobs into zq in {time.time() - t0:.1f}s")
        ctx = multiprocessing.get_context("spawn")
        fleet = [ctx.Process(target=worker, args=(ep, f"worker-{i}")) for i in range(args.workers)]
        for p in fleet:
            p.start()
        with zq.connect(ep) as c:
            deadline = time.time() + 300
            while c.stats()["queues"]["work"]["acked"] < args.messages:
                if time.time() > deadline:
                    raise SystemExit("the fleet did not finish in 300 s")
                time.sleep(0.1)
        for p in fleet:
            p.join(30)
        print(f"{args.workers} workers processed them in {time.time() - t0:.1f}s")
        results = spark.read.format("zq").option("endpoint", ep).option("topic", "results").load()
        squares = results.selectExpr("get_json_object(cast(payload as string), '$.square') as sq")
        total = squares.selectExpr("sum(cast(sq as bigint)) as total").first()["total"]
        expected = sum(n * n for n in range(args.messages))
        print(f"results: {results.count()} messages, sum of squares {total} ({'ok' if total == expected else 'WRONG'})")
        messages, events = load(spark, {"endpoint": ep})
        write(figures(messages, events), Path(args.out))
        print((Path(args.out) / "report.txt").read_text(), end="")
        return 0 if total == expected else 1
    finally:
        spark.stop()
        d.stop()


if __name__ == "__main__":
    sys.exit(main())
