"""A configured queue's name is reserved (issue 31 §3), against a real `zq serve`.

The issue's steps: a config declares ``orders`` with ``topics = "^orders\\..*"``; ``zq
publish orders.eu first`` then ``zq publish orders second`` silently replaced the
configured queue with an auto-created one (``first`` left it), and after a restart the
confirmed ``second`` was in no queue. Now the second publish is refused with a clear
error before anything is journaled, and ``first`` stays where it was across a restart.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import zq
from zq.core.errors import ReservedNameError

from .support import ROOT, cli, configured_server, env

CONFIG = r"""
[[queue]]
name = "orders"
topics = "^orders\\..*"
dead_letter = "orders.failed"
group_header = "customer"
"""


@pytest.fixture
def server(tmp_path):
    yield from configured_server(tmp_path, CONFIG)


def test_a_publish_to_a_configured_queue_name_it_does_not_take_is_refused_and_nothing_leaves(server):
    first = cli("publish", "orders.eu", "first", "--endpoint", server.endpoint)
    assert first.returncode == 0, first.stderr
    second = cli("publish", "orders", "second", "--endpoint", server.endpoint)
    assert second.returncode != 0 and "Traceback" not in second.stderr
    assert "'orders' is the name of queue 'orders'" in second.stderr and "publish to one of its topics" in second.stderr
    with zq.connect(server.endpoint) as c:
        with pytest.raises(ReservedNameError):
            c.publish("orders", b"third")
        assert [m["data"] for m in c.peek("orders", 10)] == [b"first"]
        [q] = [q for q in c.queues() if q["name"] == "orders"]
        assert q["topics"] == r"^orders\..*" and c.stats()["queues"]["orders"]["published"] == 1
    server.kill()
    server.start()
    with zq.connect(server.endpoint) as c:
        [m] = c.peek("orders", 10)
        assert m["data"] == b"first"
        assert c.explain("orders", m["bookmark"])["state"] == "waiting"
        with zq.Worker(server.endpoint, "orders", max_backlog=1) as w:  # a subscription by name reaches it
            got = w.get(timeout=5)
            assert got is not None and got.data == b"first"
            assert got.ack(wait=True) == "ok"


def test_a_config_whose_dead_letters_would_reach_no_queue_is_refused_at_start(tmp_path):
    cfg = tmp_path / "zq.toml"
    cfg.write_text('[[queue]]\nname = "jobs"\ndead_letter = "held"\n\n[[queue]]\nname = "held"\ntopics = "^parked$"\n')
    out = subprocess.run([sys.executable, "-m", "zq.cli", "serve", "--config", str(cfg), "--data", str(tmp_path / "d"),
                          "--bind", f"ipc://{tmp_path}/zq.sock"], capture_output=True, text=True, timeout=60, env=env(),
                         cwd=ROOT)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "dead_letter 'held' is the name of queue 'held'" in out.stderr, out.stderr
