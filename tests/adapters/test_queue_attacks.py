"""What a careless operator or a hostile peer found in queue-alter, the shared defaults
and dead-letter targets (a helper's attack, session 17), each kept as a test."""

from __future__ import annotations

import pytest

import zq
from zq.core.errors import ConfigError
from zq.server.config import Config


@pytest.fixture
def client(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"])).start()
    try:
        with zq.connect(d.endpoint) as c:
            yield c
    finally:
        d.stop()


def test_alter_tenant_weights_on_a_fair_share_queue(client):
    """(They were checked against blank settings, with no tenant_header: always refused.)"""
    client.create_queue("fair", tenant_header="tenant")
    result = client.alter_queue("fair", tenant_weights={"a": 5}, tenant_default_weight=2)
    assert result["settings"]["tenant_weights"] == {"a": 5} and result["settings"]["tenant_default_weight"] == 2


def test_alter_max_lease_age_is_checked_against_the_queues_own_lease(client):
    client.create_queue("slow", lease="5s")
    assert client.alter_queue("slow", max_lease_age="10s")["settings"]["max_lease_age_ms"] == 10_000


def test_alter_dead_letter_null_restores_the_topic_aware_default(client):
    """The default dead letter of a queue whose topics take NAME.dead is none (a loop otherwise)."""
    assert client.create_queue("cov", topics="cov.*")["dead_letter"] is None
    client.alter_queue("cov", dead_letter="elsewhere")
    assert client.alter_queue("cov", dead_letter=None)["settings"]["dead_letter"] is None


def test_dead_letters_that_come_back_to_their_queue_are_refused(client):
    """With an expiration, one message dead-lettered into its own queue expired into the
    next copy forever (20 journal records a second, without end)."""
    client.create_queue("loop", expiration="50ms")
    with pytest.raises(ConfigError, match=r"comes back to it \(loop -> loop\)"):
        client.alter_queue("loop", dead_letter="loop")
    with pytest.raises(ConfigError, match="comes back to it"):
        client.create_queue("self", dead_letter="self")
    client.create_queue("a", dead_letter="b")
    with pytest.raises(ConfigError, match=r"\(b -> a -> b\)"):
        client.create_queue("b", dead_letter="a")
    assert client.create_queue("b", dead_letter="")["dead_letter"] is None  # a chain that ends is fine


def test_an_auto_created_queue_does_not_dead_letter_into_a_reserved_name(client):
    """x.dead is the name of a queue that does not take it: x's dead letters would reach
    no queue. An auto-created x gets no dead letter (and the log says why) instead."""
    client.create_queue("x.dead", topics="^zzz$")
    client.publish("x", b"1")  # auto-creates x
    x = next(q for q in client.queues() if q["name"] == "x")
    assert x["dead_letter"] is None


def test_a_declare_decides_the_settings_of_a_queue_only_consumers_made(client):
    """A worker started before the service that declares its queue: the declare wins
    (the queue holds nothing and was never journaled), and the worker keeps consuming."""
    with client.subscribe("jobs") as sub:
        made = client.create_queue("jobs", lease="5s", max_deliveries=3)
        assert (made["lease_ms"], made["max_deliveries"]) == (5000, 3)
        client.publish("jobs", b"work")
        msg = sub.get(5)
        assert msg is not None and msg.data == b"work"
        msg.ack()
    with pytest.raises(zq.ZqError, match="exists"):  # now it is a queue like any other
        client.create_queue("jobs", lease="6s")


def test_fairness_left_out_and_fairness_named_as_its_default_are_the_same_queue(client):
    client.create_queue("p")
    assert client.create_queue("p", fairness="proportional")["name"] == "p"
