"""Reclaiming unstarted work over real sockets: a worker's prefetched messages it has
not started go to an idle worker (no delivery counted), never processed twice, with
every client shape (zq.connect, explicit starts, zq.Worker, asyncio), across a SIGKILLed
`zq serve`, and hostile frames answered while the dispatcher goes on."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import msgspec
import pytest

import zq
import zq.aio
from zq import wire
from zq.core.settings import QueueSettings
from zq.server.config import Config

from .support import ServerProcess, env, raw_dealer, wait_until


@pytest.fixture
def dispatcher(tmp_path):
    queues = [QueueSettings(name="jobs", lease_ms=60_000), QueueSettings(name="once", semantics="at-most-once")]
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], queues=queues)).start()
    yield d
    d.stop()


def drain(get, ack: bool = True, quiet: float = 0.3) -> list[int]:
    """Take messages until none comes for ``quiet`` seconds (bounded: at most 1,000)."""
    got = []
    for _ in range(1000):
        m = get(quiet)
        if m is None:
            return got
        if ack:
            m.ack()
        got.append(m.bookmark)
    raise AssertionError("more than 1,000 messages")


def test_an_idle_worker_gets_the_work_a_busy_one_has_not_started(dispatcher):
    with zq.connect(dispatcher.endpoint) as pub:
        sent = pub.publish_many("jobs", [b"job"] * 10)
    busy = zq.connect(dispatcher.endpoint, name="busy")
    idle = zq.connect(dispatcher.endpoint, name="idle")
    try:
        sub = busy.subscribe("jobs", max_backlog=10, reclaimable=True)
        wait_until(lambda: sub.received == 10, what="all ten prefetched by the busy worker")
        first = sub.get(timeout=5)  # started: a long job
        assert first is not None and first.bookmark == sent[0]
        other = idle.subscribe("jobs", max_backlog=10)
        taken = drain(other.get)
        # Each time the idle worker is empty again the dispatcher asks for the newer half
        # of what the busy one may not have started (10 -> 5 -> 2 -> 1 -> 1): it ends with
        # all nine; the busy one keeps only the one it works on.
        assert taken[:5] == sent[5:] and sorted(taken) == sent[1:]
        assert first.ack(wait=True) == "ok"
        assert drain(sub.get) == []  # never one the idle worker took
        stats = pub_stats(dispatcher)
        assert (stats["revoked"], stats["reclaimed"], stats["delivered"], stats["acked"]) == (9, 9, 19, 10)
        assert (sub.unstarted.released, sub.lost, other.lost) == (9, 0, 0)
    finally:
        busy.close()
        idle.close()


def pub_stats(d) -> dict:  # type: ignore[no-untyped-def]
    with zq.connect(d.endpoint) as c:
        return c.stats()["queues"]["jobs"]


def test_explicit_starts_let_a_taken_batch_be_reclaimed_until_each_is_started(dispatcher):
    with zq.connect(dispatcher.endpoint) as pub:
        sent = pub.publish_many("jobs", [b"job"] * 8)
    busy = zq.connect(dispatcher.endpoint)
    idle = zq.connect(dispatcher.endpoint)
    try:
        sub = busy.subscribe("jobs", max_backlog=8, reclaimable="explicit")
        wait_until(lambda: sub.received == 8, what="all eight prefetched")
        batch = sub.get_many(8, timeout=5)
        assert [m.bookmark for m in batch] == sent
        assert batch[0].start() and batch[1].start()
        other = idle.subscribe("jobs", max_backlog=4)  # holds what it gets until the end: hungry once
        wait_until(lambda: sub.unstarted.released == 4, what="the newer half of eight given back")
        started = [m for m in batch if m.start()]
        assert [m.bookmark for m in started] == sent[:4]
        assert drain(other.get) == sent[4:]
        for m in started:  # (acked after: with credit free again, the busy one may take work back, rightly)
            assert m.ack(wait=True) == "ok"
        given_back = batch[4]
        assert given_back.start() is False and given_back.ack(wait=True) == "done"  # acked by the other
    finally:
        busy.close()
        idle.close()


def test_a_single_threaded_worker_gives_back_what_is_still_in_its_buffer(dispatcher):
    with zq.connect(dispatcher.endpoint) as pub:
        sent = pub.publish_many("jobs", [b"job"] * 8)
    with zq.Worker(dispatcher.endpoint, "jobs", max_backlog=8, reclaimable=True) as busy:
        first = busy.get(timeout=5)
        wait_until(lambda: (busy.heartbeat(), len(busy._local) == 7)[1], what="the rest buffered")
        with zq.Worker(dispatcher.endpoint, "jobs", max_backlog=8) as idle:
            taken: list[int] = []

            def step() -> bool:
                busy.heartbeat()  # a worker answers a revoke when it calls in
                m = idle.get(timeout=0.05)
                if m is not None:
                    m.ack()
                    taken.append(m.bookmark)
                return len(taken) == 7

            wait_until(step, what="all seven not started at the idle worker")
            first.ack()
            assert drain(busy.get) == []
            assert taken[:4] == sent[4:] and sorted(taken) == sent[1:]


def test_asyncio_subscriptions_are_reclaimable_too(dispatcher):
    async def main() -> tuple[list[int], list[int], list[int]]:
        async with zq.aio.connect(dispatcher.endpoint) as c:
            sent = await c.publish_many("jobs", [b"job"] * 6)
            async with c.subscribe("jobs", max_backlog=6, reclaimable=True) as sub:
                wait = 0
                while sub.sub.received < 6 and wait < 500:
                    await asyncio.sleep(0.01)
                    wait += 1
                first = await sub.get(timeout=5)
                assert first is not None
                with zq.Worker(dispatcher.endpoint, "jobs", max_backlog=6) as idle:
                    taken = await asyncio.get_running_loop().run_in_executor(None, lambda: drain(idle.get))
                first.ack()
                rest = []
                while (m := await sub.get(timeout=0.3)) is not None:
                    m.ack()
                    rest.append(m.bookmark)
                return sent, taken, rest

    sent, taken, rest = asyncio.run(main())
    assert taken[:3] == sent[3:] and sorted(taken) == sent[1:] and rest == []


def test_reclaims_are_journaled_so_a_sigkill_keeps_the_account(tmp_path):
    """A message given back unstarted, then cut at its next holder by the dispatcher's
    death: with max_deliveries = 2 it has used one counted delivery, not two, and goes
    again after the restart; explain says it was reclaimed."""
    cfg = tmp_path / "zq.toml"
    cfg.write_text('[[queue]]\nname = "jobs"\nlease = "60s"\nmax_deliveries = 2\ndead_letter = "jobs.dead"\n')
    server = ServerProcess(tmp_path, config=cfg).start()
    try:
        with zq.connect(server.endpoint) as pub:
            sent = pub.publish_many("jobs", [b"job"] * 4)
        busy = zq.connect(server.endpoint)
        idle = zq.connect(server.endpoint)
        sub = busy.subscribe("jobs", max_backlog=4, reclaimable=True)
        wait_until(lambda: sub.received == 4, what="all four prefetched")
        assert sub.get(timeout=5) is not None
        other = idle.subscribe("jobs", max_backlog=1)
        m = other.get(timeout=10)
        assert m is not None and (m.bookmark, m.deliveries) == (sent[3], 2)
        server.kill()
        busy.close()
        idle.close()
        server.start()
        with zq.connect(server.endpoint) as c:
            doc = c.explain("jobs", sent[3])
            assert (doc["reclaimed"], doc["deliveries"], doc["causes"]["consumer_gone"]) == (1, 2, 1)
            assert [ev["kind"] for ev in doc["history"]][:3] == ["leased", "reclaimed", "leased"]
            shown = subprocess.run([sys.executable, "-m", "zq.cli", "explain", "jobs", str(sent[3]), "-e",
                                    server.endpoint], env=env(), capture_output=True, text=True, timeout=60)
            assert "1 given back unstarted, not counted" in shown.stdout, shown.stdout + shown.stderr
            s = c.subscribe("jobs", max_backlog=4)
            got = drain(s.get)
            assert sorted(got) == sent  # nothing dead-lettered, lost, or twice
            assert c.stats()["queues"].get("jobs.dead", {}).get("depth", 0) == 0
    finally:
        assert "Traceback" not in server.terminate()


def frames_until(sock, kind):  # type: ignore[no-untyped-def]
    for _ in range(100):
        msg = wire.server_decoder.decode(sock.recv())
        if type(msg) is kind:
            return msg
    raise AssertionError(f"no {kind.__name__} in 100 frames")


def test_hostile_reclaim_frames_get_clear_answers_and_the_dispatcher_goes_on(dispatcher):
    with zq.connect(dispatcher.endpoint) as pub:
        sent = pub.publish_many("jobs", [b"x"] * 4)
    raw = raw_dealer(dispatcher.endpoint)
    try:
        raw.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "raw")))
        raw.send(wire.encode(wire.Subscribe(1, "once", "once", 4, None, True)))
        assert "at-least-once" in frames_until(raw, wire.Error).message
        raw.send(wire.encode(wire.Subscribe(2, "plain", "jobs", 1)))
        assert frames_until(raw, wire.DeliverRecords).deliveries == [1]
        raw.send(wire.encode(wire.Release("plain", [sent[0]], [1])))
        assert "not reclaimable" in frames_until(raw, wire.Error).message
        raw.send(wire.encode(wire.Release("nope", [1], [1])))
        assert frames_until(raw, wire.Error).code == "protocol"
        raw.send(wire.encode(wire.Subscribe(3, "r", "jobs", 4, None, True)))
        assert len(frames_until(raw, wire.DeliverRecords).deliveries) == 3
        raw.send(wire.encode(wire.Release("r", [sent[1], sent[2]], [1])))  # epochs of another length
        assert frames_until(raw, wire.Error).code == "protocol"
        # Not asked for, huge or negative bookmarks, any epoch: ignored, nothing given back.
        raw.send(wire.encode(wire.Release("r", [sent[1], 2**64 - 1, -(2**63)], [1, 2**64 - 1, 0], [0], [7])))
        raw.send(wire.encode(wire.Release("r", list(range(70_000)), [1] * 70_000)))
        assert "at most" in frames_until(raw, wire.Error).message
        raw.send(msgspec.msgpack.encode(["sub", 4, "z", "jobs", 1, None, "yes"]))  # reclaimable of the wrong type
        assert frames_until(raw, wire.Error).code == "protocol"
        raw.send(msgspec.msgpack.encode(["release", "r", "x"]))  # bookmarks of the wrong type
        assert frames_until(raw, wire.Error).code == "protocol"
        with zq.connect(dispatcher.endpoint) as c:
            stats = c.stats()["queues"]["jobs"]
            assert (stats["reclaimed"], stats["delivered"]) == (0, 4)
            assert c.publish("jobs", b"still serving") > sent[-1]
    finally:
        raw.close(0)


def test_a_bad_reclaimable_argument_is_the_callers_error(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        for bad in ("yes", 1, None):
            with pytest.raises(ValueError, match="reclaimable"):
                c.subscribe("jobs", reclaimable=bad)
    with pytest.raises(ValueError, match="reclaimable"):
        zq.Worker(dispatcher.endpoint, "jobs", reclaimable="maybe")


def test_zq_consume_reclaimable_lets_an_idle_worker_take_what_its_slow_command_has_not_reached(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        sent = c.publish_many("jobs", [b"job"] * 8)
    slow = subprocess.Popen([sys.executable, "-m", "zq.cli", "consume", "jobs", "--reclaimable", "-b", "8", "-n", "1",
                             "-x", "sleep 5", "-e", dispatcher.endpoint], env=env(), stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: pub_stats(dispatcher)["leased"] == 8, what="the slow consumer's prefetch")
        with zq.Worker(dispatcher.endpoint, "jobs", max_backlog=8) as idle:
            taken = drain(idle.get, quiet=1.0)
        assert slow.poll() is None  # still on its first command: the seven came from its buffer
        assert sorted(taken) == sent[1:]
        assert pub_stats(dispatcher)["reclaimed"] == 7
    finally:
        slow.terminate()  # (its own pid)
        slow.wait(10)
