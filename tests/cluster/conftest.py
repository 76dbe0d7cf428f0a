"""A real ZooKeeper (Debian's package, started here on 127.0.0.1) for the cluster tests,
one per test session; each test's cluster has its own znode path."""

from __future__ import annotations

import os
import re

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
    for c in made:
        c.close()
        assert not c.tracebacks(), c.tracebacks()
