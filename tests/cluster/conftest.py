"""A real ZooKeeper (Debian's package, started here on 127.0.0.1) for the cluster tests,
one per test session; each test's cluster has its own znode path."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from zq.testing.cluster import Cluster
from zq.testing.zookeeper import ZooKeeper, missing


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    why = missing()
    if why is not None:
        if os.environ.get("ZQ_REQUIRE_ZOOKEEPER"):
            pytest.fail(f"ZooKeeper is required here (ZQ_REQUIRE_ZOOKEEPER) but {why}")
        print(f"cluster tests skipped: {why}")
        pytest.skip(f"no ZooKeeper here: {why}")
    zk = ZooKeeper(tmp_path_factory.mktemp("zookeeper")).start()
    yield zk
    zk.stop()


@pytest.fixture
def make_cluster(zookeeper, tmp_path, request):
    """``make_cluster(**kw)``: a ``Cluster`` on this session's ZooKeeper, its own path;
    every node is stopped after the test, which fails if one printed a traceback."""
    made: list[Cluster] = []

    def make(**kw) -> Cluster:
        name = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:60]
        c = Cluster(tmp_path / f"cluster{len(made)}", zookeeper.hosts, path=f"/zq/{name}_{len(made)}", **kw)
        made.append(c)
        return c

    yield make
    stop_together(made)
    for c in made:
        assert not c.tracebacks(), c.tracebacks()


def stop_together(clusters: list[Cluster]) -> None:
    """``Cluster.close()`` for every node of these clusters at once: each node still
    running is told to stop as ``Cluster.stop`` tells it (SIGCONT, then one SIGTERM: a
    second would make a leader skip its hand-over), then all are waited for together,
    each up to 30 s as there, and killed past it. One node at a time, the stops added
    up to seconds per test: tests/cluster's teardowns took 69 s in all that way, 42 s
    this way (stopping each leader first, then its standbys, measured 77 s)."""
    procs: list[subprocess.Popen] = []
    for c in clusters:
        for name in list(c.procs):
            proc = c.procs.pop(name)
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a paused one must run to stop
                proc.send_signal(signal.SIGTERM)
            procs.append(proc)
    deadline = time.monotonic() + 30
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
