"""A three-node zq cluster on loopback, and a failover you can watch.

Starts ZooKeeper (Debian's package, in a temporary directory; or give --zookeeper
HOST:PORT of one you run), three `zq serve --node` processes sharing one zq.toml, a
publisher and a worker given all three endpoints. Half-way through it SIGKILLs the
leader: ZooKeeper notices when its session times out (2 s), an in-sync standby takes
over as the next epoch, the clients move to it by themselves, and every confirmed job
is processed.

    python examples/cluster_loopback.py [--jobs 400] [--zookeeper 127.0.0.1:2181]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import zq
from zq.testing.cluster import Cluster
from zq.testing.zookeeper import ZooKeeper, missing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--zookeeper", help="HOST:PORT of a running ZooKeeper (default: start one here)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zq-cluster-") as tmp:
        zk = None
        if args.zookeeper is None:
            why = missing()
            if why:
                print(f"cannot start a ZooKeeper here: {why}")
                return 2
            zk = ZooKeeper(Path(tmp) / "zookeeper").start()
        hosts = args.zookeeper or zk.hosts  # type: ignore[union-attr]
        # One zq.toml for every node (the nodes differ by --node, --data and --bind):
        #   [cluster]  zookeeper = "...", path = "/zq/example", replicas_ack = 1
        nodes = Cluster(Path(tmp) / "nodes", hosts, path=f"/zq/example-{int(time.time())}",
                        settings='[[queue]]\nname = "jobs"\n', cluster_settings="replicas_ack = 1")
        try:
            nodes.start()
            leader, epoch = nodes.leader()
            print(f"three nodes up; {leader} leads epoch {epoch}; clients get {nodes.endpoints}")
            done: list[str] = []

            def work() -> None:
                with zq.Worker(nodes.endpoints, "jobs", max_backlog=8, connect_timeout=60) as w:
                    while len(set(done)) < args.jobs:
                        m = w.get(1.0)
                        if m is not None:
                            done.append(m.data.decode())
                            m.ack()

            worker = threading.Thread(target=work, daemon=True)
            worker.start()
            with zq.Publisher(nodes.endpoints, connect_timeout=60) as p:
                for i in range(args.jobs):
                    if i == args.jobs // 2:
                        nodes.kill(leader)  # SIGKILL, by its pid
                        killed = time.monotonic()
                        print(f"killed the leader {leader} after {i} confirmed jobs")
                    p.publish("jobs", f"job {i}", msg_id=f"job-{i}", timeout=60)  # waits out the failover
                    if i == args.jobs // 2:
                        new, new_epoch = nodes.leader(other_than=leader, epoch_above=epoch)
                        print(f"{new} leads epoch {new_epoch}; publishing went on after "
                              f"{time.monotonic() - killed:.1f}s")
            worker.join(60)
            nodes.start(leader)  # it comes back as a standby of the new leader
            print(f"{len(set(done))} of {args.jobs} jobs processed ({len(done) - len(set(done))} twice: "
                  f"in flight at the kill); every confirmed job processed: {len(set(done)) == args.jobs}")
        finally:
            nodes.close()
            if zk is not None:
                zk.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
