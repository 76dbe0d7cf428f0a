"""Delivery analytics on Spark from zq's journal: one command, Parquet + PNG + report.

    python tools/delivery_report.py --endpoint tcp://127.0.0.1:7780 --out report/
    python tools/delivery_report.py --path ./zq-data --out report/      # a copied journal

Per queue: publish -> ack latency percentiles (p50/p90/p99), deliveries and the
redelivery rate, time in queue (publish -> first delivery), dead letters by reason,
per-consumer throughput, and an ordering audit of every message group (each group's
messages first delivered in publish order). Percentiles are Spark's exact
``percentile`` (linear interpolation), so they can be checked against any other
computation of the same events.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

PERCENTILES = (0.5, 0.9, 0.99)
RATE_MIN_ACKS, RATE_MIN_SPAN_S = 10, 1.0  # below either, a consumer's rate is not shown


def load(spark: Any, source: dict[str, str]) -> tuple[Any, Any]:
    """(messages, events) DataFrames from a dispatcher (``endpoint``) or a directory (``path``)."""
    def reader():  # type: ignore[no-untyped-def]
        r = spark.read.format("zq")
        for k, v in source.items():
            r = r.option(k, v)
        return r

    messages = reader().load().select("bookmark", "topic", "timestamp", "group")
    events = reader().option("events", "*").load()
    return messages, events


def figures(messages: Any, events: Any) -> dict[str, Any]:
    """Every figure of the report as a DataFrame (nothing is computed until written)."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    ms = F.unix_micros
    published = messages.select("bookmark", F.col("timestamp").alias("published"), "group")
    first_lease = (events.where("kind = 'leased'").groupBy("queue", "bookmark")
                   .agg(F.min("time").alias("first_leased"), F.count("*").alias("deliveries"),
                        F.min("event_seq").alias("first_event")))
    acked = events.where("kind = 'acked'").groupBy("queue", "bookmark").agg(F.min("time").alias("acked"))

    def pct(col: str) -> list[Any]:
        return [F.percentile(col, p).alias(f"p{int(p * 100)}_ms") for p in PERCENTILES]

    latency = (acked.join(published, "bookmark")
               .withColumn("ms", (ms("acked") - ms("published")) / 1000.0)
               .groupBy("queue").agg(F.count("*").alias("acked"), *pct("ms")).orderBy("queue"))
    in_queue = (first_lease.join(published, "bookmark")
                .withColumn("ms", (ms("first_leased") - ms("published")) / 1000.0)
                .groupBy("queue").agg(*pct("ms")).orderBy("queue"))
    deliveries = (first_lease.groupBy("queue")
                  .agg(F.count("*").alias("messages_delivered"), F.sum("deliveries").alias("deliveries"),
                       (F.sum(F.when(F.col("deliveries") > 1, 1).otherwise(0)) / F.count("*")).alias("redelivery_rate"))
                  .orderBy("queue"))
    dead = (events.where("kind = 'expired'").groupBy("queue", "reason").agg(F.count("*").alias("messages"))
            .orderBy("queue", "reason"))
    consumers = (events.where("kind = 'acked' AND consumer IS NOT NULL").groupBy("queue", "consumer")
                 .agg(F.count("*").alias("acked"), F.min("time").alias("first"), F.max("time").alias("last"),
                      F.max("consumer_name").alias("name"))  # as it said at HELLO (zq top shows the same)
                 .withColumn("span_s", (ms("last") - ms("first")) / 1e6)
                 # a rate needs enough acks over enough time: 1 ack is not "1000/s"
                 .withColumn("per_s", F.when((F.col("acked") >= RATE_MIN_ACKS) & (F.col("span_s") >= RATE_MIN_SPAN_S),
                                             F.col("acked") / F.col("span_s")))
                 .drop("first", "last").orderBy("queue", "consumer"))
    grouped = first_lease.join(published.where("group IS NOT NULL"), "bookmark")
    order = Window.partitionBy("queue", "group").orderBy("first_event", "bookmark")
    ordering = (grouped.withColumn("previous", F.lag("bookmark").over(order))
                .groupBy("queue", "group")
                .agg(F.count("*").alias("messages"),
                     F.sum(F.when(F.col("bookmark") < F.col("previous"), 1).otherwise(0)).alias("out_of_order"))
                .orderBy("queue", "group"))
    return {"latency": latency, "time_in_queue": in_queue, "deliveries": deliveries, "dead_letters": dead,
            "consumers": consumers, "group_order": ordering}


def write(tables: dict[str, Any], out: Path, say: Any = None) -> dict[str, list[dict]]:
    """Parquet per table, a PNG of the latency percentiles, and report.txt; ``say``
    hears a line per table as it is done (a big journal takes minutes)."""
    import time

    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {}
    for i, (name, df) in enumerate(tables.items(), 1):
        started = time.monotonic()
        df.write.mode("overwrite").parquet(str(out / name))
        rows[name] = [r.asDict() for r in df.collect()]
        if say is not None:
            say(f"[{i}/{len(tables)}] {name}: {len(rows[name])} rows in {time.monotonic() - started:.1f} s")
    plot(rows["latency"], out / "latency.png")
    (out / "report.txt").write_text(report(rows))
    return rows


def plot(latency: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(latency)), 3.5))
    width = 0.25
    for i, p in enumerate(PERCENTILES):
        key = f"p{int(p * 100)}_ms"
        ax.bar([x + i * width for x in range(len(latency))], [r[key] or 0 for r in latency], width, label=key[:-3])
    ax.set_xticks([x + width for x in range(len(latency))], [r["queue"] for r in latency], fontsize=8)
    ax.set_ylabel("publish -> ack, ms")
    ax.legend(fontsize=8)
    ax.set_title("zq delivery latency per queue", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(rows: dict[str, list[dict]]) -> str:
    lines = ["zq delivery report", ""]
    for r in rows["latency"]:
        d = next((x for x in rows["deliveries"] if x["queue"] == r["queue"]), {})
        q = next((x for x in rows["time_in_queue"] if x["queue"] == r["queue"]), {})
        lines.append(f"{r['queue']}: {r['acked']} acked; publish->ack p50 {r['p50_ms']:.1f} ms, p90 {r['p90_ms']:.1f} ms, "
                     f"p99 {r['p99_ms']:.1f} ms; in queue p50 {q.get('p50_ms') or 0:.1f} ms; "
                     f"redelivery rate {100 * (d.get('redelivery_rate') or 0):.2f}%")
    for r in rows["dead_letters"]:
        lines.append(f"{r['queue']}: {r['messages']} dead-lettered ({r['reason']})")
    for r in rows["consumers"]:
        rate = (f"{r['per_s']:.0f}/s over {r['span_s']:.1f} s" if r["per_s"] is not None
                else f"too few or too quick to rate (under {RATE_MIN_ACKS} acks or {RATE_MIN_SPAN_S:g} s)")
        who = f"{r['name']} ({r['consumer']})" if r.get("name") else r["consumer"]
        lines.append(f"{r['queue']} / {who}: {r['acked']} acked, {rate}")
    bad = [r for r in rows["group_order"] if r["out_of_order"]]
    groups = len(rows["group_order"])
    lines.append(f"group order: {groups - len(bad)} of {groups} groups delivered in publish order"
                 + ("" if not bad else "; out of order: " + ", ".join(f"{r['queue']}/{r['group']}" for r in bad[:10])))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--endpoint", help="a running dispatcher")
    src.add_argument("--path", help="a journal directory (e.g. a copy)")
    parser.add_argument("--out", required=True, help="directory for the Parquet tables, latency.png, report.txt")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    from zq.spark import local_session

    spark = local_session("zq-delivery-report")
    try:
        source = {"endpoint": args.endpoint} if args.endpoint else {"path": args.path}
        tables = figures(*load(spark, source))  # lazy: nothing is read until written
        say = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
        if say:
            say(f"reading the journal from {args.endpoint or args.path}: {len(tables)} tables to compute")
        write(tables, Path(args.out), say)
        print((Path(args.out) / "report.txt").read_text(), end="")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
