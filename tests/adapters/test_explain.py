"""zq explain over real sockets: why a message is where it is, and its history from the
journal, from Python and the command line, across a SIGKILLed and restarted `zq serve`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import zq
from zq.core.errors import ProtocolError, UnknownQueueError

from .support import ROOT, cli, configured_server, env

CONFIG = """
[[queue]]
name = "orders"
group_policy = "sequenced"
max_per_subscription_backlog = 1
lease = "30s"
"""


@pytest.fixture
def server(tmp_path):
    yield from configured_server(tmp_path, CONFIG)


def test_explain_follows_a_message_from_waiting_to_leased_to_acked(server):
    with zq.connect(server.endpoint) as c, zq.Publisher(server.endpoint) as p:
        first = p.publish("orders", b"a", group="cust-1", msg_id="order-1")
        second = p.publish("orders", b"b", group="cust-1")
        doc = c.explain("orders", first)
        assert (doc["state"], doc["group"], doc["msg_id"], doc["history"]) == ("waiting", "cust-1", "order-1", [])
        assert any("no consumer" in why for why in doc["why"])
        with zq.Worker(server.endpoint, "orders", max_backlog=1, name="alice") as w:
            m = w.get(timeout=5)
            assert m is not None and m.bookmark == first
            doc = c.explain("orders", msg_id="order-1")
            assert doc["state"] == "leased" and doc["leased_to"]["name"].endswith("alice")
            assert 0 < doc["lease_ends_in_ms"] <= 30_000 and doc["deliveries"] == 1
            behind = c.explain("orders", second)
            assert behind["state"] == "waiting"
            assert any("held by" in why and "alice" in why for why in behind["why"]), behind["why"]
            assert m.ack(wait=True) == "ok"
        doc = c.explain("orders", first)
        assert doc["state"] == "not-in-queue" and "settled" in doc["why"][0]
        assert [e["kind"] for e in doc["history"]] == ["leased", "acked"]
        assert doc["history_complete"] and doc["history"][0]["name"].endswith("alice")


def test_explain_reads_its_history_from_the_journal_after_a_sigkill(server):
    with zq.Publisher(server.endpoint) as p:
        b = p.publish("orders", b"x", group="g")
    with zq.Worker(server.endpoint, "orders", max_backlog=1, name="bob") as w:
        m = w.get(timeout=5)
        assert m is not None
        m.cancel(wait=True)
        assert w.get(timeout=5) is not None  # delivery 2, left unsettled
        server.kill()
    server.start()
    with zq.connect(server.endpoint) as c:
        doc = c.explain("orders", b)
    assert doc["state"] == "waiting" and doc["deliveries"] == 2  # the count came back from the journal
    assert [(e["kind"], e["deliveries"], e["reason"]) for e in doc["history"]] == [
        ("leased", 1, ""), ("cancelled", 1, ""), ("delayed", 1, "backoff"), ("leased", 2, ""),  # (default backoff)
        ("returned", 2, "dispatcher-restart")]  # the restart journals the delivery the SIGKILL cut
    assert doc["causes"]["consumer_gone"] == 1 and doc["causes"]["cancelled"] == 1


def test_explain_on_the_command_line(server):
    with zq.Publisher(server.endpoint) as p:
        b = p.publish("orders", b"x", msg_id="42")
    out = cli("explain", "orders", str(b), "--endpoint", server.endpoint)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"orders {b}: waiting") and "no consumer" in out.stdout
    by_id = cli("explain", "orders", "42", "--msg-id", "--json", "--endpoint", server.endpoint)
    assert by_id.returncode == 0 and json.loads(by_id.stdout)["bookmark"] == b
    missing = cli("explain", "nope", "1", "--endpoint", server.endpoint)
    assert missing.returncode != 0 and "no queue named 'nope'" in missing.stderr


def test_bad_explain_requests_get_clear_errors(server):
    with zq.connect(server.endpoint) as c:
        c.publish("orders", b"x")
        with pytest.raises(UnknownQueueError):
            c.explain("nope", 1)
        with pytest.raises(ProtocolError, match="bookmark or a msg_id"):
            c.explain("orders")
        with pytest.raises(ProtocolError, match="bookmark or a msg_id"):
            c.admin("explain", queue="orders", bookmark=1, msg_id="x")
        with pytest.raises(ProtocolError, match="no message with msg_id"):
            c.explain("orders", msg_id="never")
        with pytest.raises(ProtocolError, match="at most"):
            c.explain("orders", msg_id="x" * 100_000)
        with pytest.raises(ProtocolError):
            c.admin("explain", queue="orders", bookmark="seven")
        with pytest.raises(ProtocolError):
            c.admin("explain", queue="orders", bookmark=-1)
        with pytest.raises(ValueError):
            c.explain("orders", 2**64)
        for bookmark in (0, 2**64 - 1):
            assert c.explain("orders", bookmark)["state"] == "not-in-queue"
        assert c.explain("orders", 1, history=10**9)["queue"] == "orders"  # the history is capped, not refused
        assert c.stats()["server"]["internal_errors"] == 0
