"""STATS costs the same with 10,000 queues as with 1,000: an answer lists at most
``limits.STATS_QUEUES_MAX`` queues (those holding the most messages, or those the request
names) and says how many there are. Every queue's figures once made one STATS hold the
loop for everyone (~20 us a queue; 10,000 queues: ~250 ms and a 6 MB answer)."""

from __future__ import annotations

import msgspec
import pytest

import zq
from zq import wire
from zq.core import limits
from zq.core.errors import ProtocolError
from zq.server.config import Config

from .support import cli, raw_session

MANY = limits.STATS_QUEUES_MAX + 50


@pytest.fixture(scope="module")
def crowded(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A dispatcher with more queues than one answer lists; three of them hold messages."""
    d = zq.Dispatcher(Config(data=str(tmp_path_factory.mktemp("stats") / "d"), bind=["tcp://127.0.0.1:0"])).start()
    with zq.connect(d.endpoint) as c:
        for i in range(MANY):
            c.create_queue(f"q{i:05d}")
        c.publish_many("q01040", [b"x"] * 3)  # made late: listed only because it holds messages
        c.publish_many("q00007", [b"x"] * 2)
        c.publish("q00500", b"x")
    yield d
    d.stop()


def test_an_answer_lists_the_busiest_queues_up_to_the_cap_and_counts_them_all(crowded):
    with zq.connect(crowded.endpoint) as c:
        st = c.stats()
    assert st["server"]["queues"] == MANY
    assert st["server"]["queues_listed"] == len(st["queues"]) == limits.STATS_QUEUES_MAX
    assert {"q01040", "q00007", "q00500"} <= set(st["queues"])
    assert st["queues"]["q01040"]["depth"] == 3
    assert "q01049" not in st["queues"]  # idle and made last: left out
    assert list(st["queues"])[:3] == ["q00000", "q00001", "q00002"]  # in the order the queues were made


def test_a_request_names_its_queues_and_a_name_no_queue_has_is_left_out(crowded):
    with zq.connect(crowded.endpoint) as c:
        st = c.stats(queues=["q01049", "q00007", "nosuch", "q00007"])
        assert list(st["queues"]) == ["q01049", "q00007"]
        assert st["server"]["queues"] == 2 and st["server"]["queues_listed"] == 2
        assert c.stats(queues=[])["queues"] == {}


def test_bad_stats_requests_get_a_clear_error_and_the_dispatcher_keeps_serving(crowded):
    with zq.connect(crowded.endpoint) as c:
        with pytest.raises(ValueError, match="at most 1,000 queues"):
            c.stats(queues=["q"] * (limits.STATS_QUEUES_MAX + 1))
        with pytest.raises(TypeError, match="list of queue names"):
            c.stats(queues="q00007")  # type: ignore[arg-type]
        assert list(c.stats(queues=["x" * 100_000, "q00500"])["queues"]) == ["q00500"]
    sock = raw_session(crowded.endpoint)
    try:
        for body, said in ((wire.encode(wire.Stats(1, ["q"] * (limits.STATS_QUEUES_MAX + 1))), "at most 1,000 queues"),
                           (msgspec.msgpack.encode({"t": "stats", "req": 2, "queues": [1, 2]}), "invalid command"),
                           (msgspec.msgpack.encode({"t": "stats", "req": 3, "queues": "q00007"}), "invalid command")):
            sock.send(body)
            assert sock.poll(10_000), "no answer"
            answer = wire.server_decoder.decode(sock.recv())
            assert type(answer) is wire.Error and answer.code == ProtocolError.code and said in answer.message, answer
    finally:
        sock.close()
    with zq.connect(crowded.endpoint) as c:
        assert c.stats(queues=["q00007"])["queues"]["q00007"]["depth"] == 2


def test_zq_stats_says_how_many_queues_it_left_out_and_shows_any_one(crowded):
    whole = cli("stats", "--endpoint", crowded.endpoint)
    assert whole.returncode == 0, whole.stderr
    assert f"1,000 of {MANY:,} queues listed" in whole.stderr
    one = cli("stats", "q01049", "--endpoint", crowded.endpoint, "--json")
    assert one.returncode == 0, one.stderr
    assert '"depth": 0' in one.stdout
