"""Spark data source throughput: 1,000,000 journaled messages read into Spark (Arrow,
local[2]) from a running `zq serve` and from the journal directory; and a DataFrame
written into zq (fresh ids, every message confirmed). A read figure is the median of
3 timed reads after one untimed warm-up read (Spark's Python workers start, the JIT warms);
a write figure likewise, after an untimed write of 1,000 rows."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

from bench.e2e import child_env, free_port


def spark_figures(n: int) -> list[dict]:
    from zq.client import Client
    from zq.spark import local_session

    tmp = tempfile.mkdtemp(prefix="zq-bench-spark-")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--data", f"{tmp}/j", "--bind", endpoint],
                              env=child_env(), stderr=subprocess.DEVNULL)
    spark = existing = None
    try:
        with Client(endpoint, connect_timeout=30) as c:
            payload = b"x" * 128
            futures = []
            for i in range(0, n, 4096):
                futures += c.publish_many_async("orders", [payload] * min(4096, n - i), group=None)
                if len(futures) > 16:
                    futures.pop(0).result(600)
            for f in futures:
                f.result(600)
        from pyspark.sql import SparkSession

        existing = SparkSession.getActiveSession()  # the test suite's session, in --quick tests
        spark = existing or local_session("zq-bench")
        # One untimed read first: it starts Spark's Python workers and warms the JVM's JIT,
        # which otherwise land on whichever case runs first.
        spark.read.format("zq").option("endpoint", endpoint).option("topic", "orders").load() \
            .write.format("noop").mode("overwrite").save()
        rows = []
        for label, option in (("endpoint", ("endpoint", endpoint)), ("journal directory", ("path", f"{tmp}/j"))):
            times = []
            for _ in range(3):
                df = spark.read.format("zq").option(*option).option("topic", "orders").load()
                t0 = time.perf_counter()
                df.write.format("noop").mode("overwrite").save()
                times.append(time.perf_counter() - t0)
            mid = sorted(times)[1]
            rows.append({"case": f"read 1 topic via {label}", "rows": n, "seconds": round(mid, 2),
                         "rows_per_s": round(n / mid), "best_rows_per_s": round(n / min(times)),
                         "timed_reads": 3, "partitions": 2, "master": "local[2]"})
            if label == "endpoint":
                server.terminate()  # the directory read must not share the disk with a writer
                server.wait(30)
        write_n = max(1, n // 4)
        server = subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--data", f"{tmp}/w", "--bind", endpoint],
                                  env=child_env(), stderr=subprocess.DEVNULL)
        Client(endpoint, connect_timeout=30).close()
        def frame(first: int, count: int):  # type: ignore[no-untyped-def]
            return spark.range(first, first + count, numPartitions=2).selectExpr(
                "cast(repeat('x', 128) as binary) as payload", "cast(id as string) as msg_id").cache()

        def write(df) -> None:  # type: ignore[no-untyped-def]
            df.write.format("zq").option("endpoint", endpoint).option("topic", "in").mode("append").save()

        warm = frame(-1000, 1000)  # untimed: the workers import zq.spark and connect once
        warm.count()
        write(warm)
        times = []
        for k in range(3):  # fresh ids every time, so each write really enqueues
            src = frame(k * write_n, write_n)
            src.count()
            t0 = time.perf_counter()
            write(src)
            times.append(time.perf_counter() - t0)
        mid = sorted(times)[1]
        rows.append({"case": "write (new ids, confirmed)", "rows": write_n, "seconds": round(mid, 2),
                     "rows_per_s": round(write_n / mid), "best_rows_per_s": round(write_n / min(times)),
                     "timed_writes": 3, "partitions": 2, "master": "local[2]", "durability": "batch"})
        return rows
    finally:
        if spark is not None and existing is None:
            spark.stop()
        server.terminate()
        server.wait(30)
