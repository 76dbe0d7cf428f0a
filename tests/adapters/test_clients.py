"""The Python API: embedded dispatcher, sync and asyncio clients, reconnects, config."""

from __future__ import annotations

import asyncio

import pytest

import zq
from zq.server.config import Config, duration_ms, size_bytes
from zq.core.errors import ConfigError

from .support import ServerProcess, WorkerProcess, wait_until


@pytest.fixture
def dispatcher(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"])).start()
    yield d
    d.stop()


def test_embedded_dispatcher_serves_inproc_and_tcp_at_once(dispatcher):
    with zq.connect(dispatcher.inproc) as local, zq.connect(dispatcher.endpoint) as remote:
        bm = local.publish("jobs", b"from inside", group="cust-17", priority=3, msg_id="order-1")
        with remote.subscribe("jobs", max_backlog=16) as sub:
            msg = sub.get(5)
            assert (msg.bookmark, msg.data, msg.group, msg.headers["priority"]) == (bm, b"from inside", "cust-17", "3")
            msg.ack()


def test_lease_operations_from_the_client(dispatcher):
    with zq.connect(dispatcher.inproc) as c:
        c.publish_many("ops", ["a", "b", "c"])
        with c.subscribe("ops", max_backlog=3) as sub:
            a, b, cc = sub.get(5), sub.get(5), sub.get(5)
            a.extend(60)
            b.cancel()
            cc.expire()
            again = sub.get(5)
            assert (again.bookmark, again.deliveries) == (b.bookmark, 2)
            again.ack()
            a.ack()
        wait_until(lambda: c.stats()["queues"]["ops"]["acked"] == 2, what="acks")
        st = c.stats()["queues"]
        assert st["ops"]["expired"] == 1 and st["ops.dead"]["depth"] == 1


def test_workers_take_and_settle_messages_in_batches(dispatcher):
    with zq.connect(dispatcher.inproc) as c:
        sent = c.publish_many("batchy", [f"m{i}" for i in range(100)])
        with c.subscribe("batchy", max_backlog=16) as sub:
            first = sub.get_many(10, timeout=5)
            assert 1 <= len(first) <= 10
            sub.cancel_many(first)  # all back in their places
            got: list[int] = []
            while len(got) < 100:
                batch = sub.get_many(10, timeout=5)
                assert 1 <= len(batch) <= 10, "at least one (it waits for it), at most what was asked"
                got += [m.bookmark for m in batch]
                sub.ack_many(batch)
            assert sub.get_many(10, timeout=0.05) == []  # nothing left: empty after the timeout
        assert sorted(got) == sent  # each once, the cancelled ones included
        wait_until(lambda: c.stats()["queues"]["batchy"]["acked"] == 100, what="every message acked")
        assert c.stats()["queues"]["batchy"]["cancelled"] == len(first)


def test_publish_async_keeps_a_bounded_window_and_confirms_in_order(dispatcher):
    with zq.connect(dispatcher.inproc, window=8) as c:
        futures = [c.publish_async("win", f"m{i}") for i in range(100)]
        bookmarks = [f.result(10) for f in futures]
    assert bookmarks == sorted(bookmarks) and len(set(bookmarks)) == 100


def test_an_unknown_queue_without_auto_queues_is_an_error(tmp_path):
    cfg = Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], auto_queues=False)
    with zq.Dispatcher(cfg) as d, zq.connect(d.inproc) as c:
        with pytest.raises(zq.UnknownQueueError):
            c.subscribe("nope")
        with pytest.raises(zq.UnknownQueueError):
            c.subscribe("nope", filter="a = 1")


def test_asyncio_client_has_the_same_shape(dispatcher):
    async def main():
        async with await zq.aio.connect(dispatcher.endpoint) as c:
            sent = [await c.publish("aio", f"m{i}") for i in range(5)]
            got = []
            async with await c.subscribe("aio", max_backlog=4) as sub:
                async for msg in sub:
                    got.append(msg.bookmark)
                    msg.ack()
                    if len(got) == 5:
                        break
            await c.publish_many("aio.batch", [f"b{i}" for i in range(6)])
            batched = []
            async with await c.subscribe("aio.batch", max_backlog=8) as sub:
                while len(batched) < 6:
                    batch = await sub.get_many(4, timeout=5)
                    assert 1 <= len(batch) <= 4
                    batched += [m.data for m in batch]
                    sub.ack_many(batch)
            assert batched == [f"b{i}".encode() for i in range(6)]
            await c.publish("aio", b'{"n": 1}')
            claimed = await c.claim("aio", limit=5, wait=1)
            claimed[0].ack()
            rows = await c.query("aio", aggregates=["count"])
            return sent, got, [m.data for m in claimed], rows

    sent, got, claimed, rows = asyncio.run(main())
    assert sent == got and claimed == [b'{"n": 1}'] and rows == [{"count": 0}]


def test_asyncio_connect_and_subscribe_work_with_and_without_await(dispatcher):
    """``async with zq.aio.connect(...)`` (the README's shape) and ``await`` both work,
    for the client and for a subscription; ``async with`` closes what it opened."""
    async def main():
        async with zq.aio.connect(dispatcher.endpoint) as c:
            await c.publish("aio.shapes", b"one")
            async with c.subscribe("aio.shapes", max_backlog=2) as sub:
                msg = await sub.get(timeout=5)
                await msg.ack()  # awaitable too (it returns at once: the ack is queued)
            assert sub.sub.closed
        assert c.client.closed
        c2 = await zq.aio.connect(dispatcher.endpoint)
        sub2 = await c2.subscribe("aio.shapes", max_backlog=2)
        await c2.publish("aio.shapes", b"two")
        msg2 = await sub2.get(timeout=5)
        msg2.ack()
        await sub2.close()
        await c2.close()
        return msg.data, msg2.data

    assert asyncio.run(main()) == (b"one", b"two")


def test_a_worker_reconnects_and_resubscribes_after_the_server_restarts(tmp_path):
    server = ServerProcess(tmp_path).start()
    worker = WorkerProcess(server.endpoint, "jobs", tmp_path / "w.log")
    try:
        wait_until(lambda: worker.log.exists(), what="worker subscribed")
        with zq.connect(server.endpoint) as c:
            c.publish("jobs", "before")
        wait_until(lambda: len(worker.lines()) == 1, what="first message")
        server.terminate()
        server.start()
        with zq.connect(server.endpoint) as c:
            after = c.publish("jobs", "after")
        # (not "two lines": an ack still batched at the stop brings "before" back too, maybe in the same instant)
        wait_until(lambda: [str(after), "-", "1", "done"] in worker.lines(), timeout=30,
                   what="the worker to resubscribe by itself and take the message published after the restart")
    finally:
        worker.stop()
        server.terminate()


@pytest.mark.parametrize(("text", "ms"), [("30s", 30_000), ("500ms", 500), ("5m", 300_000), ("1h", 3_600_000), ("7d", 604_800_000)])
def test_durations_in_the_config_carry_units(text, ms):
    assert duration_ms(text, "k") == ms


def test_sizes_in_the_config_carry_units():
    assert size_bytes("64MiB", "k") == 64 * 2**20 and size_bytes("1KB", "k") == 1000
    with pytest.raises(ConfigError, match="server.max_message_size"):
        size_bytes("huge", "server.max_message_size")


def test_config_file_round_trip_and_errors_that_name_the_key(tmp_path):
    path = tmp_path / "zq.toml"
    path.write_text(
        '[server]\ndata = "d"\nbind = ["tcp://127.0.0.1:7799"]\ndurability = "fsync"\n'
        '[[queue]]\nname = "jobs"\ntopics = "^jobs$"\nlease = "45s"\nexpiration = "1h"\n'
        'group_header = "customer"\ngroup_policy = "exclusive"\ndead_letter = "jobs.failed"\n'
    )
    cfg = Config.load(path)
    q = cfg.queues[0]
    assert (cfg.durability, q.lease_ms, q.expiration_ms, q.group_header, q.group_policy) == (
        "fsync", 45_000, 3_600_000, "customer", "exclusive")
    for text, key in [
        ('[[queue]]\nname = "a"\nsemantics = "at-most-once"\nfairness = "fast"\n', "queue[0]"),
        ('[[queue]]\nname = "a"\nmax_cancels = "x"\n', "max_cancels"),
        ('[[queue]]\nname = "a"\ntopics = "(("\n', "queue[0].topics"),
        ('[[queue]]\nname = "a"\n[[queue]]\nname = "a"\n', "unique"),
        ('[server]\ndurability = "always"\n', "server.durability"),
        ("not toml [", "TOML"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            Config.load(path)
