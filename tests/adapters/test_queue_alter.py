"""Queues can change, over real sockets and across a restart: declare again, alter, the
defaults every queue shares, and what a consumer of an unknown name creates."""

from __future__ import annotations

import json

import pytest

import zq
from zq.core.errors import ProtocolError, QueueExistsError, UnknownQueueError
from zq.core.settings import QueueSettings
from zq.server.config import Config

from .support import ServerProcess, cli


def start(tmp_path, queues=()):  # type: ignore[no-untyped-def]
    return zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], queues=list(queues))).start()


def test_declare_alter_and_both_survive_a_restart(tmp_path):
    d = start(tmp_path)
    try:
        with zq.connect(d.endpoint) as c:
            first = c.create_queue("payments", lease="10s")
            assert first["dead_letter"] == "payments.dead" and first["backoff_ms"] == [1000, 5000, 30000, 60000, 300000]
            assert c.create_queue("payments", lease="10s") == first  # declared again, as it is: fine
            with pytest.raises(QueueExistsError, match=r"lease_ms: 10000 -> 30000") as exc:
                c.create_queue("payments")
            assert exc.value.code == "exists"
            c.publish("payments", b"charge 1")
            result = c.alter_queue("payments", backoff=["2s", "1m"], max_deliveries=5, dead_letter="")
            assert result["changed"] == ["max_deliveries: 20 -> 5", "dead_letter: 'payments.dead' -> None",
                                         "backoff_ms: [1000, 5000, 30000, 60000, 300000] -> [2000, 60000]"]
            with pytest.raises(ProtocolError, match="topics cannot change on a live queue"):
                c.alter_queue("payments", topics="payments.*")
            with pytest.raises(UnknownQueueError):
                c.alter_queue("nosuch", lease="1s")
    finally:
        d.stop()
    d = start(tmp_path)
    try:
        with zq.connect(d.endpoint) as c:
            q = next(q for q in c.queues() if q["name"] == "payments")
            assert (q["backoff_ms"], q["max_deliveries"], q["dead_letter"], q["lease_ms"]) == ([2000, 60000], 5, None,
                                                                                              10000)
            with c.subscribe("payments") as sub:
                assert sub.get(5).data == b"charge 1"  # the messages stayed through the alter and the restart
    finally:
        d.stop()


def test_bad_alter_arguments_are_refused_and_the_dispatcher_keeps_serving(tmp_path):
    d = start(tmp_path)
    try:
        with zq.connect(d.endpoint) as c:
            c.create_queue("jobs")
            for bad in ({"lease": "-1s"}, {"lease": 2**63}, {"max_deliveries": "many"}, {"backoff": ["1s"] * 10_000},
                        {"fairness": "x" * 1_000_000}, {"no_such_key": 1}, {"dead_letter": 7}, {}):
                with pytest.raises(zq.ZqError):
                    c.alter_queue("jobs", **bad)
            with pytest.raises(zq.ZqError):
                c.admin("queue-alter", name=["not", "a", "name"], lease="1s")
            assert c.alter_queue("jobs", lease="1m")["changed"] == ["lease_ms: 30000 -> 60000"]
    finally:
        d.stop()


def test_a_config_queue_is_declared_as_is_and_altered_only_in_its_file(tmp_path):
    d = start(tmp_path, [QueueSettings(name="fixed", lease_ms=5000)])
    try:
        with zq.connect(d.endpoint) as c:
            with pytest.raises(zq.ZqError, match="config file"):
                c.alter_queue("fixed", lease="1s")
            with pytest.raises(QueueExistsError, match=r"\(in the config file, which wins\)"):
                c.create_queue("fixed", lease="1s")
    finally:
        d.stop()


def test_a_consumer_of_a_covered_topic_is_told_where_its_messages_go(tmp_path):
    d = start(tmp_path, [QueueSettings(name="orders", topics=r"orders\..*")])
    try:
        with zq.connect(d.endpoint) as c:
            with pytest.raises(UnknownQueueError, match="go to queue 'orders'"):
                c.subscribe("orders.eu")
            assert [q["name"] for q in c.queues()] == ["orders"]
    finally:
        d.stop()


def test_a_typo_consumer_leaves_no_queue_after_a_restart(tmp_path):
    d = start(tmp_path)
    try:
        with zq.connect(d.endpoint) as c:
            with c.subscribe("jbos") as sub:
                assert sub.get(0.05) is None
            with c.subscribe("jobs") as sub:
                c.publish("jobs", b"x")  # a message entered it: it stays
                sub.get(5).ack()
    finally:
        d.stop()
    d = start(tmp_path)
    try:
        with zq.connect(d.endpoint) as c:
            assert [q["name"] for q in c.queues()] == ["jobs"]
    finally:
        d.stop()


def test_the_cli_alters_and_says_what_changed(tmp_path):
    server = ServerProcess(tmp_path / "d").start()
    try:
        ep = server.endpoint
        assert cli("queue", "create", "work", "-e", ep).returncode == 0
        again = cli("queue", "create", "work", "-e", ep)
        assert again.returncode == 0 and "exists, as asked" in again.stdout
        clash = cli("queue", "create", "work", "--lease", "5s", "-e", ep)
        assert clash.returncode == 2 and "lease_ms: 30000 -> 5000" in clash.stderr
        run = cli("queue", "alter", "work", "--lease", "5s", "--backoff", "none", "--no-dead-letter", "-e", ep)
        assert run.returncode == 0, run.stderr
        assert "altered queue 'work': lease_ms: 30000 -> 5000; dead_letter: 'work.dead' -> None; backoff_ms:" in run.stdout
        assert "unchanged" in cli("queue", "alter", "work", "--lease", "5s", "-e", ep).stdout
        assert cli("queue", "alter", "work", "-e", ep).returncode == 2  # nothing named
        shown = json.loads(cli("queue", "list", "--json", "-e", ep).stdout)
        assert next(q for q in shown if q["name"] == "work")["backoff_ms"] == []
        gone = cli("queue", "delete", "nosuch", "-e", ep)  # no --yes, no terminal: says there is none first
        assert gone.returncode == 2 and "no queue named 'nosuch'" in gone.stderr and "--yes" not in gone.stderr
    finally:
        server.terminate()


def test_the_asyncio_client_declares_alters_and_deletes(tmp_path):
    import asyncio

    from zq.aio import connect as aio_connect

    d = start(tmp_path)

    async def main() -> None:
        async with aio_connect(d.endpoint) as c:
            await c.create_queue("jobs", lease="5s")
            assert (await c.alter_queue("jobs", lease="6s"))["changed"] == ["lease_ms: 5000 -> 6000"]
            assert await c.admin("queue-delete", name="jobs") == 0  # (an admin's name= reaches it)

    try:
        asyncio.run(main())
    finally:
        d.stop()
