"""The zq PySpark data source against a real local Spark and a real dispatcher."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import zq
from zq.server.config import Config

from ..adapters.support import ROOT, env


@pytest.fixture
def dispatcher(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"])).start()
    yield d
    d.stop()


def test_batch_read_of_messages_with_headers_groups_priorities_and_ranges(spark, dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        bms = [c.publish("orders", json.dumps({"n": i}), group=f"g{i % 3}", priority=i, msg_id=f"o{i}",
                         headers={"region": "eu" if i % 2 else "us"}) for i in range(50)]
        c.publish("other", b"not this one")
    ep = dispatcher.endpoint
    df = spark.read.format("zq").option("endpoint", ep).option("topic", "orders").option("partitions", "3").load()
    rows = sorted(df.collect(), key=lambda r: r.bookmark)
    assert [r.bookmark for r in rows] == bms
    r = rows[7]
    assert (r.topic, r.msg_id, r.group, r.priority, json.loads(r.payload)) == ("orders", "o7", "g1", 7, {"n": 7})
    assert r.headers == {"group": "g1", "priority": "7", "region": "eu"}
    part = spark.read.format("zq").option("endpoint", ep).option("topic", "orders") \
        .option("from", str(bms[10])).option("to", str(bms[20])).load()
    assert sorted(x.bookmark for x in part.collect()) == bms[10:20]
    assert spark.read.format("zq").option("endpoint", ep).option("topic", "^o.*").load().count() == 51
    assert df.where("headers['region'] = 'eu'").count() == 25


def test_batch_read_of_delivery_events_one_row_per_bookmark(spark, dispatcher, tmp_path):
    with zq.connect(dispatcher.endpoint) as c:
        bms = c.publish_many("work", [f"m{i}" for i in range(20)])
        with c.subscribe("work", max_backlog=8) as sub:
            for i in range(20):
                m = sub.get(5)
                m.cancel() if i == 3 else m.ack()
            sub.get(5).ack()  # the cancelled one, again
    ev = spark.read.format("zq").option("endpoint", dispatcher.endpoint).option("events", "work").load()
    kinds = {r.kind: r["count"] for r in ev.groupBy("kind").count().collect()}
    assert kinds == {"leased": 21, "acked": 20, "cancelled": 1, "delayed": 1}  # (the retry waits the default backoff)
    again = ev.where("kind = 'leased' AND deliveries = 2").collect()
    assert len(again) == 1 and again[0].bookmark in bms and again[0].queue == "work"


def test_offline_read_of_a_copied_journal_directory(spark, dispatcher, tmp_path):
    with zq.connect(dispatcher.endpoint) as c:
        bms = c.publish_many("audit", [f"a{i}" for i in range(30)])
    dispatcher.stop()
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "d", copy)
    df = spark.read.format("zq").option("path", str(copy)).option("topic", "audit").load()
    assert sorted(r.bookmark for r in df.collect()) == bms


def test_streaming_read_resumes_from_its_checkpoint_without_gaps_or_duplicates(spark, dispatcher, tmp_path):
    ep = dispatcher.endpoint
    out, ck = tmp_path / "out", tmp_path / "ck"

    def run_once() -> None:
        q = (spark.readStream.format("zq").option("endpoint", ep).option("topic", "feed")
             .option("maxBookmarksPerBatch", "40").load()
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)

    with zq.connect(ep) as c:
        first = c.publish_many("feed", [f"f{i}" for i in range(100)])
        run_once()
        second = c.publish_many("feed", [f"s{i}" for i in range(70)])
        run_once()
    got = [r.bookmark for r in spark.read.parquet(str(out)).collect()]
    assert sorted(got) == first + second  # every bookmark once: no gap, no duplicate


RETRY_JOB = """
import sys
from pyspark import TaskContext
from zq.spark import ZqDataSource, ZqWriter, local_session, publish_batches
ep, topic = sys.argv[1], sys.argv[2]
spark = local_session("zq-retry", extra={"spark.master": "local[2,3]", "spark.sql.execution.arrow.maxRecordsPerBatch": "500"})


class FlakyWriter(ZqWriter):
    # Attempt 0 of partition 0 really publishes its first 1,000 rows, then dies.
    def write(self, iterator):
        ctx = TaskContext.get()
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            def first_rows(batches):
                n = 0
                for b in batches:
                    yield b
                    n += b.num_rows
                    if n >= 1000:
                        return
            publish_batches(self.opts, first_rows(iterator))
            raise RuntimeError("injected failure after 1,000 rows were published")
        return super().write(iterator)


class FlakySource(ZqDataSource):
    @classmethod
    def name(cls):
        return "zq-flaky"

    def writer(self, schema, overwrite):
        return FlakyWriter(self.options, overwrite)


spark.dataSource.register(FlakySource)
df = spark.range(0, 4000, numPartitions=2).selectExpr("cast(concat('row-', id) as binary) as payload")
df.write.format("zq-flaky").option("endpoint", ep).option("topic", topic).mode("append").save()
print("written")
"""


def test_write_with_a_forced_task_retry_enqueues_nothing_twice(spark, dispatcher, tmp_path):
    script = tmp_path / "retry_job.py"
    script.write_text(RETRY_JOB)
    run = subprocess.run([sys.executable, str(script), dispatcher.endpoint, "out"], capture_output=True, text=True,
                         timeout=300, env=env(), cwd=ROOT)
    assert run.returncode == 0 and "written" in run.stdout, run.stderr[-3000:]
    with zq.connect(dispatcher.endpoint) as c:
        st = c.stats()
        assert st["queues"]["out"]["published"] == 4000
        assert st["duplicates"] == 1000  # the failed attempt's rows, absorbed by dedup on the retry
        payloads = [m.data for m in c.replay("out")]
    assert len(payloads) == len(set(payloads)) == 4000


def test_overwrite_is_refused_and_rows_become_messages(spark, dispatcher):
    df = spark.createDataFrame([("a", "g1", 5, {"k": "v"}, "id-1"), ("b", None, None, None, "id-2")],
                               "payload string, `group` string, priority bigint, headers map<string,string>, msg_id string")
    w = df.write.format("zq").option("endpoint", dispatcher.endpoint).option("topic", "in")
    with pytest.raises(Exception, match="append-only"):
        w.mode("overwrite").save()
    w.mode("append").save()
    w.mode("append").save()  # same msg_ids: nothing new
    with zq.connect(dispatcher.endpoint) as c:
        got = {m["data"]: m["headers"] for m in c.peek("in")}
        assert got == {b"a": {"k": "v", "group": "g1", "priority": "5"}, b"b": {}}
        assert c.stats()["duplicates"] == 2


def test_copying_a_topic_whose_messages_have_no_msg_id_derives_ids(spark, dispatcher):
    """The README's copy: `orders.selectExpr("payload", "msg_id").write...`, where most
    messages were published without an id: those rows get derived ids, so a second
    run of the same copy enqueues nothing."""
    with zq.connect(dispatcher.endpoint) as c:
        c.publish_many("plain", [b"a", b"b", b"a"])
        c.publish("plain", b"c", msg_id="id-c")
        before = c.stats()["duplicates"]
    src = spark.read.format("zq").option("endpoint", dispatcher.endpoint).option("topic", "plain").load()
    for _ in range(2):
        (src.selectExpr("payload", "msg_id").write.format("zq").option("endpoint", dispatcher.endpoint)
            .option("topic", "plain.copy").mode("append").save())
    with zq.connect(dispatcher.endpoint) as c:
        assert c.stats()["queues"]["plain.copy"]["published"] == 4
        assert c.stats()["duplicates"] - before == 4  # the second copy: every row a duplicate
        assert sorted(m.data for m in c.replay("plain.copy")) == [b"a", b"a", b"b", b"c"]


def test_a_queue_read_covers_its_topics(spark, dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        c.create_queue("eu-orders", topics=r"orders\.eu\..*")
        want = [c.publish("orders.eu.fr", b"1"), c.publish("orders.eu.de", b"2")]
        c.publish("orders.us.ny", b"3")
    df = spark.read.format("zq").option("endpoint", dispatcher.endpoint).option("queue", "eu-orders").load()
    assert sorted(r.bookmark for r in df.collect()) == want
