"""zq benchmarks: ``python -m bench run SCENARIO [--quick]`` prints a table and writes JSON.

Scenarios: engine-memory, engine-throughput (the pure core), throughput, latency (the
relay floor first, then that relay committing each message to LMDB before it forwards
it, each tcp row's p50 ÷ the relay's), peak,
groups (a real `zq serve` with worker processes over tcp loopback), memory (heap and
RSS per queued message), recovery (start-up time from a big journal), peers (the raw
relay, zq with each kind of client, Redis Streams, NATS JetStream, RabbitMQ classic and
quorum on the same workload, in one invocation, each zq row ÷ Redis and ÷ the relay, with
every process's CPU per message; `--repeat N` interleaves them round by round), filters (what an expression
costs per message), claims (a claim's round trip, a long poll's wake-up), kinds (a
10-level priority queue next to a FIFO: memory per message and engine throughput),
ceiling (a raw pyzmq relay on the standard workload, next to zq: zq / ceiling), floors
(raw pyzmq latency on this machine, paced as the latency scenario), idle-queues (what
thousands of unused queues cost a step and the latency of the queue in use), build (the compiled
core against the interpreted one), engine-vs (``--ref REV``: that git revision's engine
against this tree's, interleaved: what a change cost), reclaim (short jobs behind a long
one with prefetch, plain and reclaimable, interleaved), replication (the standard
workload with replicas_ack = 1 and a `zq standby` against 0, interleaved), transactions
(a pipeline stage: one output per input, as a plain ack, publish-then-ack, one commit
per batch, one per message not waited for, and one per message waited for), loop-cost
(the dispatcher loop thread's CPU per iteration, step by step, at the standard workload
and at 2,000 msg/s, beside the journal's commit alone),
cluster-replication (the same on an elected cluster of two nodes and a ZooKeeper), failover (an
elected cluster of three with a real ZooKeeper: the leader SIGKILLed again and again,
the time to the first delivery by the new leader), faults (a long seeded run of leader
kills, leader pauses and standby kills, with a checker's counts). Results go to
bench/runs/ (not tracked); ``--record`` writes them to bench/results/, the tracked
figures the docs cite, on purpose.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"  # tracked: the figures the docs cite (--record)
RUNS = Path(__file__).parent / "runs"  # every other run (git-ignored)
SCENARIOS = ("engine-memory", "engine-throughput", "throughput", "latency", "peak", "groups", "memory", "recovery", "peers",
             "filters", "claims", "spark", "kinds", "ceiling", "floors", "idle-queues", "build", "engine-vs", "reclaim",
             "replication", "cluster-replication", "failover", "faults", "abuse", "transactions", "loop-cost")


def redis_latency(secs: float) -> list[dict]:
    """Redis Streams' row beside zq's latency rows (when redis-server is installed)."""
    import shutil

    if shutil.which("redis-server") is None:
        print("latency: redis-server not installed: no Redis Streams row (apt-get install redis-server)")
        return []
    from bench import peers

    return [peers.latency(secs)]


def latency_rows(secs: float) -> list[dict]:
    """zq's latency rows beside the raw relay's (the ZeroMQ floor of these processes,
    paced alike: ``bench.floors``), the same relay committing each message to LMDB first,
    and Redis Streams', in one invocation; each tcp row's p50 judged against the relay's."""
    from bench import e2e, floors

    relay = {**floors.relay(secs), "system": "raw pyzmq relay", "transport": "tcp loopback"}
    # The relay storing each publish in LMDB before it forwards it: what journaling before
    # sending (DESIGN) costs these processes, with nothing of zq's own in the path.
    journaling = {**floors.relay(secs, commit=True), "system": "raw pyzmq relay + an LMDB commit per message",
                  "transport": "tcp loopback"}
    rows = [journaling] + [e2e.latency(secs, durability=d) for d in ("batch", "fsync")] + [
        e2e.latency(secs, durability="batch", publisher="paced-publisher")] + [
        e2e.latency(secs, durability="batch", consumer="client"), e2e.embedded_latency(secs, clients="client"),
        e2e.embedded_latency(secs), e2e.embedded_latency(secs, clients="direct")]
    floor = relay["publish_to_worker_us"]["p50"]
    for row in rows:
        if row.get("transport") == "tcp loopback" and floor:
            row["p50_of_relay"] = round(row["publish_to_worker_us"]["p50"] / floor, 2)
    return [relay, *rows, *redis_latency(secs)]


def peers_rows(n: int) -> list[dict]:
    """The standard workload on the raw relay (the ceiling of these Python clients), zq
    with each kind of client, and the peers, in one invocation; each zq row judged
    against Redis Streams' and the relay's rows of the same invocation."""
    from bench import ceiling, e2e, peers

    relay = {**ceiling.throughput(n), "scenario": "peers"}
    zq_rows = [{"system": "zq (batch), lean clients", **e2e.throughput(n, mode="publisher-many")},
               {"system": "zq (batch), zq.connect", **e2e.throughput(n, mode="many", consumer="client-batches")}]
    zq_rows += [{"system": f"zq ({d})", **e2e.throughput(n, durability=d)} for d in ("batch", "fsync")]
    others = [peers.run(system, n) for system in peers.CONFIRMS]
    redis = next(r for r in others if r["system"] == "redis-streams")
    for row in zq_rows:
        row["of_redis"] = round(row["e2e_msgs_per_s"] / redis["e2e_msgs_per_s"], 3)
        row["of_relay"] = round(row["e2e_msgs_per_s"] / relay["e2e_msgs_per_s"], 3)
    return [relay, *zq_rows, *others]


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import lmdb
    import msgspec
    import zmq

    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "lmdb": ".".join(map(str, lmdb.version())),
        "msgspec": msgspec.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def run(scenario: str, quick: bool, ref: str = "HEAD") -> list[dict]:
    from bench import engine

    if scenario == "engine-memory":
        sizes = [20_000] if quick else [1_000_000]
        return [engine.memory(n) for n in sizes] + [engine.memory(n, grouped=True) for n in sizes]
    if scenario == "engine-throughput":
        n = 20_000 if quick else 1_000_000
        rows = []
        for _ in range(1 if quick else 3):  # fenced and unfenced interleaved: the fence's cost in one invocation
            for fenced in (False, True):
                rows += [
                    engine.throughput(n, backlog=16, batch=64, fenced=fenced),
                    engine.throughput(n, backlog=256, batch=64, fenced=fenced),
                    engine.throughput(n, backlog=16, batch=64, groups=1000, fenced=fenced),
                ]
        return rows
    if scenario == "kinds":
        return engine.kinds(20_000, 20_000) if quick else engine.kinds(1_000_000, 500_000)
    if scenario == "spark":
        from bench import spark

        return spark.spark_figures(20_000 if quick else 1_000_000)
    if scenario == "filters":
        from bench import access

        return access.filter_costs(20_000 if quick else 1_000_000)
    from bench import e2e

    if scenario == "claims":
        from bench import access

        return access.claim_latency(200 if quick else 5_000)
    if scenario == "abuse":
        from bench import abuse

        return abuse.run(quick)
    if scenario == "reclaim":
        from bench import reclaim

        return reclaim.compare(1, 12, 300, 5) if quick else reclaim.compare(3, 32, 1000, 10)
    if scenario == "engine-vs":
        from bench import build

        return build.versus(ref, 1 if quick else 3, 20_000 if quick else 1_000_000)
    if scenario == "build":
        from bench import build

        return build.compare(1 if quick else 3, 20_000 if quick else 1_000_000, 3_000 if quick else 100_000)
    if scenario == "ceiling":
        from bench import ceiling

        n = 5_000 if quick else 100_000
        rows = []
        for _ in range(1 if quick else 2):  # interleaved, so machine noise hits both alike
            raw = ceiling.throughput(n)
            zq_row = e2e.throughput(n, durability="batch")
            rows += [raw, {**zq_row, "scenario": "ceiling", "system": "zq (batch)",
                           "of_ceiling": round(zq_row["e2e_msgs_per_s"] / raw["e2e_msgs_per_s"], 3)}]
        return rows
    if scenario in ("failover", "faults"):
        from bench import failover

        if scenario == "failover":
            return failover.failover(2 if quick else 20)
        return failover.faults(3 if quick else 30)
    if scenario == "replication":
        n = 5_000 if quick else 100_000
        rows = []
        for _ in range(1 if quick else 3):  # interleaved: machine noise hits both alike
            plain = e2e.throughput(n, durability="batch")
            replicated = e2e.throughput(n, durability="batch", replicas_ack=1)
            replicated["of_unreplicated"] = round(replicated["e2e_msgs_per_s"] / plain["e2e_msgs_per_s"], 3)
            rows += [plain, replicated]
        return rows
    if scenario == "cluster-replication":
        n = 5_000 if quick else 100_000
        rows = []
        for _ in range(1 if quick else 3):  # an elected cluster of two nodes, each way, interleaved
            plain = e2e.throughput(n, durability="batch", cluster=True)
            replicated = e2e.throughput(n, durability="batch", replicas_ack=1, cluster=True)
            replicated["of_unreplicated"] = round(replicated["e2e_msgs_per_s"] / plain["e2e_msgs_per_s"], 3)
            rows += [plain, replicated]
        return rows
    if scenario == "throughput":
        n = 5_000 if quick else 100_000
        return [e2e.throughput(n, durability=d) for d in ("batch", "fsync")] + [
            e2e.throughput(n, durability="batch", consumer=c) for c in ("client", "client-batches")]
    if scenario == "latency":
        return latency_rows(1.0 if quick else 10.0)
    if scenario == "transactions":
        # A pipeline stage's cost: the standard workload, one output per input, settled as a
        # plain ack (no output), publish-then-ack, one commit per batch, one per message;
        # ``--repeat`` interleaves the rounds.
        n = 3_000 if quick else 100_000
        rows = [e2e.throughput(n, consumer=c) for c in ("worker", "worker-publish-then-ack", "worker-tx",
                                                         "worker-tx-pipelined", "worker-tx-each")]
        for row in rows[1:]:
            row["of_plain_ack"] = round(row["e2e_msgs_per_s"] / rows[0]["e2e_msgs_per_s"], 3)
        return rows
    if scenario == "idle-queues":
        from bench import queues

        return queues.run(quick)
    if scenario == "loop-cost":
        from bench import loopcost

        return loopcost.run(quick)
    if scenario == "floors":
        from bench import floors

        return floors.floors(0.5 if quick else 10.0)
    if scenario == "peak":
        n = 5_000 if quick else 300_000
        return [e2e.throughput(n, durability=d, backlog=256, mode="batch64") for d in ("batch", "fsync")]
    if scenario == "groups":
        # The target compares 1,000 groups with no groups: both in the same invocation, with
        # the one-in-flight policy (sequenced groups before the QIP's holder rule) beside.
        n = 5_000 if quick else 100_000
        rows = [e2e.throughput(n, groups=g, group_policy=p)
                for g, p in ((0, "sequenced"), (1000, "sequenced"), (10, "sequenced"), (1000, "one-in-flight"),
                             (10, "one-in-flight"))]
        for row in rows[1:]:
            row["of_ungrouped"] = round(row["e2e_msgs_per_s"] / rows[0]["e2e_msgs_per_s"], 3)
        return rows
    from bench import peers, scale

    if scenario == "peers":
        return peers_rows(3_000 if quick else 100_000)

    if scenario == "memory":
        if quick:
            return [{**engine.memory(20_000), **scale.server_memory(20_000)}]
        rows = [{**engine.memory(n), **scale.server_memory(n)} for n in (1_000_000, 10_000_000)]
        return rows + [{**engine.memory(1_000_000), **scale.server_memory(1_000_000, size=4096)}]
    if scenario == "recovery":
        return [scale.recovery(20_000, 2_000) if quick else scale.recovery(10_000_000, 1_000_000)]
    raise SystemExit(f"unknown scenario {scenario!r}; try {', '.join(SCENARIOS)}")


def summarise(same: list[dict]) -> dict:
    """One row from N runs of the same case: numeric figures become median [min-max]."""
    if len(same) == 1:
        return same[0]
    out: dict = {}
    for key, value in same[0].items():
        values = [row[key] for row in same]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and len(set(values)) > 1:
            v = sorted(values)
            out[key] = f"{v[len(v) // 2]} [{v[0]}-{v[-1]}]"
        elif isinstance(value, dict):
            out[key] = {k: summarise([{k: row[key][k]} for row in same])[k] for k in value}
        else:
            out[key] = value
    out["runs"] = same
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one scenario")
    r.add_argument("scenario")
    r.add_argument("--quick", action="store_true", help="tiny sizes (the test suite runs these)")
    r.add_argument("--out", default=None, help="JSON file to write (default bench/runs/SCENARIO.json)")
    r.add_argument("--record", action="store_true", help="write to bench/results/, the tracked figures the docs cite")
    r.add_argument("--repeat", type=int, default=1, help="run N times; print the median [min-max] of each figure")
    r.add_argument("--ref", default="HEAD", help="engine-vs: the git revision to compare this tree with")
    args = parser.parse_args(argv)
    runs = [[{**row, "scenario": args.scenario} for row in run(args.scenario, args.quick, args.ref)]
             for _ in range(args.repeat)]
    rows = [summarise([r[i] for r in runs]) for i in range(len(runs[0]))]
    meta = machine()
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items() if k != "runs"))
    print(f"machine: {meta['cores']} cores, {meta['cpu']}, Python {meta['python']}, {meta['date']}")
    where = RESULTS if args.record else RUNS
    out = Path(args.out) if args.out else where / f"{args.scenario}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": meta, "results": rows}, indent=2) + "\n")
    from bench.plot import plot

    png = plot(args.scenario, rows, meta, out.with_suffix(".png"))
    if png is not None:
        print(f"wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
