"""Poisoned message bodies over real sockets (issue 31 §1): no record stops `zq serve`.

The issue's reproductions, each against a real `zq serve`: a filter (SUB, CLAIM, REPLAY,
PEEK, QUERY, purge, move, ack-filter) reading a body that is not valid UTF-8 inside, or
nested 200,000 deep, killed the process or answered ``internal``; published to a queue
with a priority, sort key or last-value key it was answered ``internal`` but journaled,
and `zq serve` then died at every start. Now: confirmed, set aside as poison, and the
dispatcher serves across a SIGKILL and restart.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import zq

from .support import ROOT, configured_server, env

CONFIG = """
[[queue]]
name = "ranked"
priority = "/k"
dead_letter = "ranked.dead"

[[queue]]
name = "sorted"
sort_key = "/k"
dead_letter = "sorted.dead"

[[queue]]
name = "latest"
lvq_key = "/k"
dead_letter = "latest.dead"

[[queue]]
name = "picky"
filter = "/k > 0"
dead_letter = "picky.dead"

[[queue]]
name = "plain"
"""

BAD_UTF8 = b"\x81\xa1k\xa2\xff\xfe"  # msgpack {"k": <not UTF-8>}
BAD_KEY = b'{"\xff\xfe": 1, "k": 3}'
DEEP = b'{"k": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
POISONS = [BAD_UTF8, BAD_KEY, DEEP]  # through filters
UNREADABLE = [BAD_UTF8, b'{"k": "\xff"}', DEEP]  # what a value expression on /k cannot read


@pytest.fixture
def server(tmp_path):
    yield from configured_server(tmp_path, CONFIG)


def dead_letters(c: zq.Client, queue: str) -> list[dict]:
    return [m for m in c.peek(queue, 100)]


def test_filters_over_poisoned_bodies_match_nothing_and_every_request_is_answered(server):
    with zq.connect(server.endpoint) as c:
        good = c.publish("plain", b'{"k": 1}')
        for body in POISONS:
            c.publish("plain", body)
        with c.subscribe("plain", max_backlog=8, filter="/k = 1") as sub:  # killed `zq serve` before
            m = sub.get(timeout=5)
            assert m is not None and m.bookmark == good
            m.ack()
        more = c.publish("plain", b'{"k": 2}')
        [claimed] = c.claim("plain", limit=4, filter="/k = 2")
        assert claimed.bookmark == more
        claimed.ack()
        with c.replay("plain", filter="/k <= 2", end=more + 1) as r:
            assert [m.bookmark for m in r] == [good, more]
        assert [p["bookmark"] for p in c.peek("plain", 10, filter="/k IS NULL")] == []  # unreadable is no match
        assert len(c.peek("plain", 10)) == 3
        [row] = c.query("plain", aggregates=["count", "count(/k)", "max(/k)"])
        assert (row["count"], row["count(/k)"], row["max(/k)"]) == (3, 1, 3)  # BAD_KEY's /k reads: its bad key is skipped
        assert c.move("plain", "plain.held", filter="/k = 3") == 1
        assert c.ack_filter("plain", "/k = 7") == 0
        assert c.purge("plain", filter="/k = 1") == 0
        assert c.stats()["server"]["internal_errors"] == 0


def test_a_poisoned_body_is_confirmed_set_aside_and_survives_a_sigkill_and_restart(server):
    queues = ["ranked", "sorted", "latest"]
    with zq.Publisher(server.endpoint) as p:
        kept = {q: [p.publish(q, b'{"k": 5}')] for q in queues}
        poisoned = {q: [p.publish(q, body) for body in UNREADABLE] for q in queues}  # confirmed, not `internal`
        for q in queues:
            kept[q].append(p.publish(q, b'{"k": 6}'))
        p.publish("picky", BAD_UTF8)  # a filter that cannot read it: it is not the queue's
        picked = p.publish("picky", b'{"k": 1}')
    with zq.connect(server.endpoint) as c:
        st = c.stats()["queues"]
        for q in queues:
            assert st[q]["poisoned"] == 3, (q, st[q])
            assert sorted(m["bookmark"] for m in c.peek(q, 10)) == kept[q]
        assert st["picky"]["poisoned"] == 0 and [m["bookmark"] for m in c.peek("picky", 10)] == [picked]
    server.kill()
    server.start()  # died at every start before
    with zq.connect(server.endpoint) as c:
        st = c.stats()["queues"]
        for q in queues:
            assert sorted(m["bookmark"] for m in c.peek(q, 10)) == kept[q]
            dead = dead_letters(c, f"{q}.dead")
            assert len(dead) == 3, (q, dead)  # once, not again at the restart
            assert {d["headers"]["zq.reason"] for d in dead} == {"poison"}
            assert sorted(int(d["headers"]["zq.bookmark"]) for d in dead) == poisoned[q]
            assert any(d["headers"]["zq.error"].startswith("RecursionError") for d in dead)
            assert any(d["headers"]["zq.error"].startswith("UnicodeDecodeError") for d in dead)
        doc = c.explain("ranked", poisoned["ranked"][0])
        assert doc["state"] == "poisoned" and "could not evaluate" in doc["why"][0]
        assert doc["history"][-1]["reason"] == "poison" and doc["history"][-1]["error"].startswith("UnicodeDecodeError")
        with zq.Worker(server.endpoint, "ranked", max_backlog=4) as w:  # the rest flows, by priority
            got = w.get_many(4, timeout=5)
            assert [m.bookmark for m in got] == [kept["ranked"][1], kept["ranked"][0]]
    out = subprocess.run([sys.executable, "-m", "zq.cli", "explain", "ranked", str(poisoned["ranked"][2]),
                          "--endpoint", server.endpoint], capture_output=True, text=True, timeout=60, env=env(), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "poisoned" in out.stdout and "(poison: RecursionError" in out.stdout, out.stdout
    stats = subprocess.run([sys.executable, "-m", "zq.cli", "stats", "--json", "--endpoint", server.endpoint],
                           capture_output=True, text=True, timeout=60, env=env(), cwd=ROOT)
    assert json.loads(stats.stdout)["queues"]["ranked.dead"]["depth"] == 3
