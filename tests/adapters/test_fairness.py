"""Two-level fairness over real sockets: tenants share a queue by weight, priority ages,
the shares start again fairly after a SIGKILLed dispatcher, and every knob refuses bad
values with a clear error while the dispatcher keeps serving."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

import zq
from zq.core.settings import QueueSettings
from zq.server.config import Config

from .support import ServerProcess, env

FAIR = QueueSettings(name="jobs", tenant_header="tenant", tenant_weights={"gold": 3}, group_header=None)


@pytest.fixture
def dispatcher(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], queues=[FAIR])).start()
    yield d
    d.stop()


def take(c: zq.Client, n: int) -> list[zq.Message]:
    """``n`` deliveries, one at a time (backlog 1): the order the dispatcher chose."""
    got = []
    with c.subscribe("jobs", max_backlog=1) as sub:
        for _ in range(n):
            m = sub.get(10)
            got.append(m)
            m.ack(wait=True)
    return got


def test_tenants_share_the_queue_by_weight_whatever_order_they_published_in(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        c.publish_many("jobs", [b"x"] * 60, headers={"tenant": "free"})  # first, and many
        c.publish_many("jobs", [b"x"] * 60, headers={"tenant": "gold"})
        c.publish_many("jobs", [b"x"] * 3)  # no tenant header: the tenant ""
        st = c.stats()["queues"]["jobs"]
        assert st["kind"] == "tenants"
        assert st["tenants"] == [{"tenant": "free", "weight": 1, "held": 60}, {"tenant": "gold", "weight": 3, "held": 60},
                                 {"tenant": "", "weight": 1, "held": 3}]
        counts = Counter(m.headers.get("tenant", "") for m in take(c, 25))
        # 3 : 1 : 1 while all three wait (gold, free, gold, gold per unit of the clock, and "" while it has
        # any): three units of five, then units of four, the last one cut after its first two
        assert counts == {"gold": 16, "free": 6, "": 3}, counts
        waiting = [r["bookmark"] for r in c.peek("jobs", limit=200)]
        doc = c.explain("jobs", waiting[-1])
        assert doc["tenant"]["name"] in ("free", "gold") and doc["state"] == "waiting"
        assert any("fair share" in w for w in doc["why"]), doc["why"]


def test_priority_ages_so_a_stream_of_urgent_work_never_starves_the_rest(tmp_path):
    queue = QueueSettings(name="jobs", priority="priority", priority_aging=5, group_header=None)
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], queues=[queue])).start()
    try:
        with zq.connect(d.endpoint) as c:
            low = c.publish("jobs", b"low", priority=0)
            c.publish_many("jobs", [b"urgent"] * 40, priority=2)
            order = [m.bookmark for m in take(c, 41)]
            assert order.index(low) <= 2 * 5 + 1  # two levels, each worth five messages of waiting
    finally:
        d.stop()


def test_shares_start_again_fairly_after_a_sigkilled_dispatcher(tmp_path):
    cfg = tmp_path / "zq.toml"
    cfg.write_text('[[queue]]\nname = "jobs"\ngroup_header = ""\ntenant_header = "tenant"\n'
                   'tenant_weights = { gold = 3 }\n')
    server = ServerProcess(tmp_path, config=cfg).start()
    try:
        with zq.connect(server.endpoint) as c:
            free = c.publish_many("jobs", [b"x"] * 40, headers={"tenant": "free"})
            gold = c.publish_many("jobs", [b"x"] * 40, headers={"tenant": "gold"})
        server.kill()
        server.start()
        with zq.connect(server.endpoint) as c:
            assert c.stats()["queues"]["jobs"]["tenants"][0]["held"] == 40
            first = take(c, 20)
            counts = Counter(m.headers["tenant"] for m in first)
            assert counts == {"gold": 15, "free": 5}, counts
            rest = take(c, 60)
            assert sorted(m.bookmark for m in first + rest) == sorted(free + gold)  # nothing lost, none twice
    finally:
        assert "Traceback" not in server.terminate()


def test_a_queue_created_at_run_time_takes_tenants_and_aging(dispatcher):
    cli = [sys.executable, "-m", "zq.cli", "queue", "create"]
    out = subprocess.run(cli + ["shared", "--tenant-header", "customer", "--tenant-weight", "acme=4",
                                "--tenant-weight", "a=b=2", "--tenant-default-weight", "2", "--priority", "priority",
                                "--priority-aging", "100", "--json", "-e", dispatcher.endpoint],
                         env=env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    assert (created["tenant_header"], created["tenant_weights"], created["tenant_default_weight"],
            created["priority_aging"]) == ("customer", {"acme": 4, "a=b": 2}, 2, 100)
    for bad, says in ((["--tenant-header", "t", "--tenant-weight", "acme"], "TENANT=WEIGHT"),
                      (["--tenant-header", "t", "--tenant-weight", "acme=x"], "TENANT=WEIGHT"),
                      (["--tenant-header", "t", "--tenant-weight", "acme=0"], "weight is a whole number"),
                      (["--tenant-header", "t", "--tenant-weight", "acme=99999999999999999999"], "weight"),
                      (["--tenant-weight", "acme=2"], "need tenant_header"),
                      (["--priority-aging", "5"], "set priority too"),
                      (["--tenant-header", "t", "--sort-key", "k"], "sort_key")):
        out = subprocess.run(cli + ["other", *bad, "-e", dispatcher.endpoint], env=env(), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode != 0 and says in out.stderr, (bad, out.stderr)
    with zq.connect(dispatcher.endpoint) as c:  # still serving
        assert "shared" in c.stats()["queues"]


@pytest.mark.parametrize("settings, says", [
    ({"tenant_header": "t", "tenant_weights": {"a": "heavy"}}, "tenant_weights"),
    ({"tenant_header": "t", "tenant_weights": [1, 2]}, "tenant_weights"),
    ({"tenant_header": 7}, "tenant_header"),
    ({"tenant_header": "x" * 100_000}, "tenant_header"),
    ({"priority": "p", "priority_aging": -1}, "priority_aging"),
    ({"priority": "p", "priority_aging": 2**63}, "priority_aging"),
    ({"priority": "p", "priority_aging": "fast"}, "priority_aging"),
])
def test_hostile_fairness_settings_are_refused_and_the_dispatcher_keeps_serving(dispatcher, settings, says):
    with zq.connect(dispatcher.endpoint) as c:
        with pytest.raises(zq.ZqError, match=says):
            c.create_queue("hostile", **settings)
        assert c.publish("jobs", b"still here") > 0


def test_a_weight_too_big_to_travel_is_refused_by_the_client(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        with pytest.raises(ValueError, match="cannot send"):
            c.create_queue("hostile", tenant_header="t", tenant_weights={"a": 10**30})
        assert "hostile" not in c.stats()["queues"]


def test_fairness_in_the_config_file_is_checked():
    import tomllib

    for text, says in (('tenant_header = "t"\ntenant_weights = { a = 0 }', "weight"),
                       ('tenant_header = "t"\ntenant_weights = { a = "x" }', "tenant_weights"),
                       ('tenant_weights = { a = 2 }', "need tenant_header"),
                       ('tenant_header = "t"\ntarget_queue_depth = 10', "target_queue_depth"),
                       ('priority_aging = 3', "set priority too")):
        with pytest.raises(zq.ConfigError, match=says):
            Config.from_dict(tomllib.loads(f'[[queue]]\nname = "q"\n{text}\n'))
