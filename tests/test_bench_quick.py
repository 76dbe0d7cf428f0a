"""Every bench scenario in --quick mode runs and yields complete, sane figures (no timing asserted)."""

import json
import shutil

import pytest

from bench.__main__ import main
from bench.loopcost import COUNTED


@pytest.mark.parametrize("scenario", ["engine-memory", "engine-throughput", "throughput", "latency", "peak", "groups", "memory",
                                      "recovery", "peers", "filters", "claims", "kinds", "ceiling", "floors",
                                      "idle-queues", "build", "engine-vs", "reclaim", "replication", "cluster-replication",
                                      "failover", "faults", "loop-cost"])
def test_quick_bench_runs_and_writes_complete_results(scenario, tmp_path, capsys, monkeypatch):
    if scenario == "engine-vs":
        monkeypatch.setenv("ZQ_PURE", "1")  # HEAD's copy installs interpreted: no minute of mypyc in the suite
    if scenario == "peers":
        missing = [b for b in ("redis-server", "nats-server", "rabbitmq-server") if shutil.which(b) is None]
        if missing:
            pytest.skip(f"peer servers not installed: {missing} (apt-get install redis-server nats-server rabbitmq-server)")
    if scenario in ("failover", "faults", "cluster-replication"):
        import os

        from zq.testing.zookeeper import missing

        why = missing()
        if why and os.environ.get("ZQ_REQUIRE_ZOOKEEPER"):
            pytest.fail(f"ZooKeeper is required here (ZQ_REQUIRE_ZOOKEEPER) but {why}")
        if why:
            pytest.skip(f"no ZooKeeper here: {why}")
    check_quick_run(scenario, tmp_path, capsys)


def check_quick_run(scenario: str, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Run ``scenario --quick``; its JSON, table and plot must be complete and sane."""
    out = tmp_path / "r.json"
    assert main(["run", scenario, "--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["python"]
    assert doc["results"], "no rows"
    if scenario == "floors":
        assert any("stored" in r for r in doc["results"]), doc["results"]  # the journaling relay ran
        assert all("server_cpu_us_per_msg_by_thread" in r for r in doc["results"] if "relay" in r["case"]), doc
    for row in doc["results"]:
        assert row["scenario"] == scenario
        if scenario in ("latency", "floors"):
            keys = [k for k in row if k.endswith("_us")]
            assert keys, row
            for key in keys:
                assert set(row[key]) == {"p50", "p99", "p99.9"} and all(v > 0 for v in row[key].values()), row
            if "stored" in row:  # the relay that journals: every message it relayed is in its LMDB file
                assert row["stored"] == row["messages"] > 0, row
            if scenario == "latency" and row.get("transport") == "tcp loopback" and "consumer" in row:
                assert row["server_cpu_us_per_msg"] > 0, row  # what each message costs the dispatcher at that rate
                assert "server_cpu_us_per_msg_by_thread" in row, row
            if "server_cpu_us_per_msg_by_thread" in row:  # the same by kind of thread: the loop's, libzmq's, others
                split = row["server_cpu_us_per_msg_by_thread"]
                assert set(split) == {"main thread", "ZeroMQ I/O threads", "other threads"}, row
                assert split["main thread"] > 0 and min(split.values()) >= 0, row
            continue
        if scenario == "loop-cost":  # the loop's steps counted in a real `zq serve`, or the commit alone
            if "steps" in row:
                assert row["iterations"] > 0 and row["messages_per_iteration"] > 0, row
                assert set(row["steps"]) == {label for _, _, label in COUNTED}, row  # every counter ran
                whole = row["steps"]["iteration (after poll)"]["us_per_iteration"]
                for step in row["steps"].values():
                    assert step["us_per_iteration"] > 0 and step["calls_per_iteration"] > 0, row
                assert row["steps"]["commit and sends"]["us_per_iteration"] <= whole, row  # a part of the iteration
            else:
                assert row["us_per_commit"] > 0 and row["us_per_message"] > 0, row
            continue
        if scenario == "idle-queues":  # a step's cost, or the latency beside idle queues
            figures = [row["us_per_step"]] if "us_per_step" in row else list(row["publish_to_worker_us"].values())
            assert figures and all(v > 0 for v in figures), row
            continue
        if scenario == "groups" and row["groups"]:
            assert row["of_ungrouped"] > 0, row  # judged against the ungrouped run of the same invocation
        if scenario in ("replication", "cluster-replication") and row["replicas_ack"]:
            assert row["of_unreplicated"] > 0, row  # judged against the run without, in the same invocation
        if scenario in ("throughput", "peak", "peers"):
            assert "server_cpu_us_per_msg" in row, row  # the dispatcher's (or peer server's) CPU per message
        if scenario == "build" and "speedup" in row:
            assert row["speedup"] > 0, row
        if scenario == "reclaim" and row["case"] == "reclaimable":
            assert row["given_back"] > 0, row  # the idle worker took what the stuck one had not started
        if scenario in ("failover", "faults"):
            # the checker's counts: nothing confirmed was lost, no group out of order
            assert row["confirmed"] > 0 and row["lost"] == 0 and row["group_order_breaks"] == 0, row
            if scenario == "failover":
                assert row["kills"] == 2 and row["failover_ms"]["p50"] > 0, row
            else:
                assert sum(row[k] for k in ("leader_killed", "leader_paused", "standby_killed")) == 3, row
            continue  # (times and counts: no rate to check)
        if scenario == "engine-vs" and "ratio" in row:
            assert row["ratio"] > 0 and row["this_tree_msgs_per_s"] > 0, row
        numbers = [v for k, v in row.items() if k.endswith(("_per_s", "bytes_per_message", "seconds_to_serving"))]
        assert numbers and all(isinstance(v, (int, float)) and v > 0 for v in numbers), row
    assert scenario in capsys.readouterr().out
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "a PNG plot next to the JSON"
