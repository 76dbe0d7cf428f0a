"""Every example in examples/ runs, as a user would run it, against a real `zq serve`
(tiny sizes), and says what it showed. The Spark one is tested in tests/spark."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.adapters.support import ServerProcess, env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

# example, its arguments, a line its output must hold
CASES = [
    ("worker_fleet.py", ["--jobs", "60", "--workers", "2"], "60 jobs done by 2 workers; exit codes [0, 0]"),
    ("sequenced_groups.py", ["--customers", "3", "--orders", "6"], "every customer's orders in order"),
    ("priority_queue.py", [], "highest first, oldest first within a priority"),
    ("fair_tenants.py", ["--flood", "60"], "shared by weight (2 : 1 : 1), not by who came first"),
    ("claims_long_poll.py", [], "claimed 5 in one request"),
    ("reclaim_prefetch.py", ["--jobs", "12", "--long", "0.6"], "short jobs no longer wait for the long one: True"),
    ("asyncio_pubsub.py", ["--messages", "120"], "consumed 120 of 120, in publish order: True"),
    ("dead_letters.py", [], "redrove 1; second pass: 1 paid, 0 failed"),
    ("consume_exec.sh", [], "processed 12 images with 4 shell workers"),
    ("embedded_dispatcher.py", ["--ticks", "200"], "each instrument in order: True"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("examples")).start()
    yield s
    assert "Traceback" not in s.terminate()


@pytest.mark.parametrize(("example", "args", "says"), CASES, ids=[c[0] for c in CASES])
def test_the_example_runs_and_shows_what_it_says(server, example, args, says):
    path = EXAMPLES / example
    cmd = ["bash", str(path)] if example.endswith(".sh") else [sys.executable, str(path)]
    e = env()
    e["ZQ_ENDPOINT"] = server.endpoint
    e["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), e.get("PATH", "")])  # the `zq` command
    before = queue_names(server)
    done = subprocess.run([*cmd, *args], env=e, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, f"{example} failed:\n{done.stdout}\n{done.stderr}"
    assert says in done.stdout, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    left = queue_names(server) - before
    assert left == set(), f"{example} left its queues {sorted(left)} on the dispatcher"


def queue_names(server) -> set[str]:  # type: ignore[no-untyped-def]
    from zq.client import Client

    with Client(server.endpoint) as c:
        return {q["name"] for q in c.queues()}


def test_the_worker_fleet_shares_the_work_out(server):
    """The workers subscribe before the jobs are published: every one of them does some."""
    e = dict(env(), ZQ_ENDPOINT=server.endpoint)
    done = subprocess.run([sys.executable, str(EXAMPLES / "worker_fleet.py"), "--jobs", "90", "--workers", "3"],
                          env=e, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    did = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(w\d+): did (\d+) jobs", done.stdout, re.M)}
    assert sorted(did) == ["w0", "w1", "w2"] and sum(did.values()) == 90, done.stdout
    assert all(n > 0 for n in did.values()), f"a worker did nothing: {did}"


def test_every_example_is_tested_and_listed_in_the_readme():
    tested = {c[0] for c in CASES} | {"spark_fleet.py", "cluster_loopback.py"}  # (tests/spark, tests/cluster)
    present = {p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh")}
    assert present == tested, f"untested or missing: {present ^ tested}"
    readme = (ROOT / "README.md").read_text()
    for name in present:
        assert f"examples/{name}" in readme, f"README does not link examples/{name}"
