"""Retry schedules, cancels with their own delay, delayed publishes and parked groups
over real sockets: a `zq serve` with a config file, the Python clients, the CLI, a raw
DEALER for hostile frames, and a SIGKILLed dispatcher whose delays must survive."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import zq
from zq import wire
from zq.core.settings import QueueSettings
from zq.server.config import Config

from .support import ServerProcess, env, raw_dealer, wait_until
from .test_fencing import frames_until


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def dispatcher(tmp_path):
    queues = [QueueSettings(name="jobs", backoff_ms=[300, 3_600_000], backoff_jitter=0.0, max_deliveries=50),
              QueueSettings(name="orders", backoff_ms=[3_600_000], backoff_jitter=0.0)]
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], queues=queues)).start()
    yield d
    d.stop()


def test_a_cancelled_message_comes_back_after_the_backoff_not_before(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        b = c.publish("jobs", b"flaky")
        with c.subscribe("jobs") as sub:
            msg = sub.get(5)
            assert msg.bookmark == b
            cancelled_at = now_ms()
            msg.cancel()
            row = wait_until(lambda: next((r for r in c.peek("jobs") if "not_before_ms" in r), None),
                             what="the cancelled message waiting for its retry")
            assert row["bookmark"] == b and cancelled_at + 300 <= row["not_before_ms"] <= now_ms() + 300
            assert c.stats()["queues"]["jobs"]["delayed"] == 1
            again = sub.get(10)
            assert again.bookmark == b and again.deliveries == 2
            assert now_ms() >= row["not_before_ms"]
            again.ack()


def test_a_cancel_names_its_delay_and_zero_means_at_once(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        b = c.publish("orders", b"x")  # the queue's backoff is an hour
        with c.subscribe("orders") as sub:
            msg = sub.get(5)
            assert msg.cancel(delay=0) == "ok"
            msg = sub.get(5)
            assert (msg.bookmark, msg.deliveries) == (b, 2)
            t0 = now_ms()
            assert msg.cancel(delay=0.25) == "ok"
            msg = sub.get(10)
            assert (msg.bookmark, msg.deliveries) == (b, 3) and now_ms() - t0 >= 250
            assert msg.cancel(delay=0.25) == "ok"
            assert msg.cancel(delay=0.25) == "lost"  # already given back (it waits to go again): the fence says so
            msg = sub.get(10)
            assert msg.deliveries == 4
            msg.ack()


def test_a_parked_group_holds_only_itself(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        a1 = c.publish("orders", b"a1", group="A")
        a2 = c.publish("orders", b"a2", group="A")
        with c.subscribe("orders", max_backlog=1) as sub:
            msg = sub.get(5)
            assert msg.bookmark == a1
            msg.cancel()  # an hour's backoff: group A is parked behind a1
            b = [c.publish("orders", f"b{i}".encode(), group=f"B{i}") for i in range(5)]
            got = []
            for _ in range(5):
                m = sub.get(5)
                got.append(m.bookmark)
                m.ack()
            assert got == b  # every other group flowed
            assert sub.get(0.3) is None  # a1 waits; a2 waits behind it
            doc = c.explain("orders", a2)
            assert doc["state"] == "waiting" and any("parked" in why for why in doc["why"]), doc
            doc = c.explain("orders", a1)
            assert doc["not_before_ms"] > now_ms() + 3_000_000 and "retry" in doc["why"][0], doc


def test_delayed_publishes_from_every_client_wait(dispatcher, tmp_path):
    with zq.connect(dispatcher.endpoint) as c, zq.Publisher(dispatcher.endpoint) as p:
        t0 = now_ms()
        late = [c.publish("later", b"client", delay=0.4),
                p.publish("later", b"publisher", delay=0.4),
                c.publish("later", b"absolute", not_before=(t0 + 400) / 1000)]
        late += c.publish_many("later", [b"m1", b"m2"], delay=0.4)
        now = c.publish("later", b"now")
        with c.subscribe("later", max_backlog=10) as sub:
            first = sub.get(5)
            assert first.bookmark == now
            assert sub.get(0.1) is None or now_ms() - t0 >= 400
            got = [sub.get(10) for _ in late]
            assert now_ms() - t0 >= 400
            assert sorted(m.bookmark for m in got) == sorted(late)
            for m in [first, *got]:
                m.ack()
        with pytest.raises(ValueError, match="delay"):
            c.publish("later", b"x", delay=-1)
        with pytest.raises(ValueError, match="delay"):
            c.publish("later", b"x", delay=float("nan"))
        with pytest.raises(TypeError, match="delay"):
            c.publish("later", b"x", delay="5s")
        with pytest.raises(TypeError, match="not_before"):
            p.publish("later", b"x", not_before=True)
        with pytest.raises(ValueError, match="not_before"):
            c.publish("later", b"x", not_before=1e15)


def test_bad_delays_on_the_wire_get_clear_answers_and_the_dispatcher_goes_on(dispatcher):
    raw = raw_dealer(dispatcher.endpoint)
    try:
        raw.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "raw")))
        for delay, not_before in ((-5, 0), (2**63, 0), (0, -1), (0, 2**64 - 1)):
            raw.send(wire.encode(wire.Publish(1, "jobs", [(b"x", {}, None)], delay, not_before)))
            err = frames_until(raw, wire.Error)
            assert err.code == "protocol" and ("delay" in err.message or "not-before" in err.message), err
        raw.send(wire.encode(wire.Publish(2, "jobs", [(b"x", {}, None)], 0, 0)))
        [b] = frames_until(raw, wire.Confirm).bookmarks
        raw.send(wire.encode(wire.Subscribe(3, "s", "jobs", 1)))
        assert frames_until(raw, wire.DeliverRecords).deliveries == [1]
        for delay in (-2, 2**63 - 1):
            raw.send(wire.encode(wire.Cancel("s", [b], [1], 4, delay)))
            assert frames_until(raw, wire.Error).code == "protocol"
        raw.send(b"\x96\xa6cancel\xa1s\x91\x01\x91\x01\x05\xa3bad")  # a delay of the wrong type
        assert frames_until(raw, wire.Error).code == "protocol"
        raw.send(wire.encode(wire.Cancel("s", [b], [1], 6, 0)))
        assert frames_until(raw, wire.Reply).data == {"ok": [b]}
        assert frames_until(raw, wire.DeliverRecords).deliveries == [2]  # still serving, at once
    finally:
        raw.close(0)


def test_delays_survive_a_sigkilled_dispatcher(tmp_path):
    """A retry's wait and a publish's delay are journaled: after SIGKILL and a restart
    each message waits for the rest of its time (not again from the start, not less)."""
    cfg = tmp_path / "zq.toml"
    cfg.write_text('[[queue]]\nname = "jobs"\nbackoff = ["2s"]\nbackoff_jitter = 0.0\n')
    server = ServerProcess(tmp_path, config=cfg).start()
    try:
        with zq.connect(server.endpoint) as c:
            retried = c.publish("jobs", b"retried")
            delayed = c.publish("jobs", b"delayed", delay=2.5)
            with c.subscribe("jobs") as sub:
                msg = sub.get(5)
                assert msg.bookmark == retried
                msg.cancel(wait=True)
            due = {r["bookmark"]: r["not_before_ms"] for r in c.peek("jobs")}
        assert set(due) == {retried, delayed}
        server.kill()
        server.start()
        with zq.connect(server.endpoint) as c:
            assert {r["bookmark"]: r["not_before_ms"] for r in c.peek("jobs")} == due
            with c.subscribe("jobs", max_backlog=2) as sub:
                for _ in range(2):
                    m = sub.get(10)
                    assert now_ms() >= due[m.bookmark], (m.bookmark, due)
                    m.ack()
            history = c.explain("jobs", retried)["history"]
            assert [e["kind"] for e in history] == ["leased", "cancelled", "delayed", "leased", "acked"]
            assert history[2]["due_ms"] == due[retried]
    finally:
        assert "Traceback" not in server.terminate()


def test_the_cli_publishes_with_a_delay_and_peek_shows_when(dispatcher):
    cli = [sys.executable, "-m", "zq.cli"]
    out = subprocess.run(cli + ["publish", "later", "hello", "--delay", "1h", "-e", dispatcher.endpoint],
                         env=env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    b = int(out.stdout)
    peek = subprocess.run(cli + ["peek", "later", "-e", dispatcher.endpoint], env=env(), capture_output=True,
                          text=True, timeout=60)
    row = json.loads(peek.stdout.splitlines()[0])
    assert row["bookmark"] == b and row["not_before_ms"] > now_ms() + 3_500_000
    bad = subprocess.run(cli + ["publish", "later", "x", "--delay", "soon", "-e", dispatcher.endpoint],
                         env=env(), capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "not a duration" in bad.stderr


def test_backoff_in_the_config_file_is_checked(tmp_path):
    for text, says in (('backoff = ["1s", "soon"]', r"backoff\[1\]"), ('backoff = "1s"', "backoff"),
                       ('backoff = ["-1s"]', "backoff"), ("backoff_jitter = 2.0", "backoff_jitter"),
                       ('backoff = [' + ', '.join(['"1s"'] * 40) + ']', "at most 32")):
        with pytest.raises(zq.ConfigError, match=says):
            Config.from_dict(__import__("tomllib").loads(f'[[queue]]\nname = "q"\n{text}\n'))


def test_a_queue_created_at_run_time_takes_a_backoff(dispatcher):
    cli = [sys.executable, "-m", "zq.cli", "queue", "create"]
    out = subprocess.run(cli + ["retrying", "--backoff", "1s, 10s,1m", "--backoff-jitter", "0.2", "--json",
                                "-e", dispatcher.endpoint], env=env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    assert (created["backoff_ms"], created["backoff_jitter"]) == ([1000, 10_000, 60_000], 0.2)
    for bad, says in ((["--backoff", "1s,soon"], "not a duration"), (["--backoff-jitter", "3"], "backoff_jitter")):
        out = subprocess.run(cli + ["other", *bad, "-e", dispatcher.endpoint], env=env(), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode != 0 and says in out.stderr, out.stderr


def test_a_connected_consumers_leases_renew_until_the_maximum_age_across_a_sigkill(tmp_path):
    """zq.connect's I/O thread heartbeats: a long job keeps its message with no extend
    call; a stuck one loses it at max_lease_age. After a SIGKILL and a restart the
    redelivered message renews the same way."""
    cfg = tmp_path / "zq.toml"
    cfg.write_text('[[queue]]\nname = "jobs"\nlease = "300ms"\nmax_lease_age = "2s"\n')
    server = ServerProcess(tmp_path, config=cfg).start()
    try:
        with zq.connect(server.endpoint) as c, zq.connect(server.endpoint) as other:
            a = c.publish("jobs", b"long job")
            with c.subscribe("jobs") as sub, other.subscribe("jobs") as rival:
                msg = sub.get(5)
                assert msg.bookmark == a
                assert rival.get(1.2) is None  # four lease periods: renewed, not redelivered
                assert msg.ack(wait=True) == "ok"
                b = c.publish("jobs", b"stuck job")
                stuck = sub.get(5) if rival.get(0.2) is None else None
                assert stuck is not None and stuck.bookmark == b
                t0 = time.monotonic()
                again = wait_until(lambda: sub.get(0.05) or rival.get(0.05), timeout=10,
                                   what="the stuck delivery to time out and go again")
                assert again.bookmark == b and again.deliveries == 2 and time.monotonic() - t0 >= 1.5
                assert stuck.ack(wait=True) == "lost"
                again.ack()
            assert c.stats()["queues"]["jobs"]["renewed"] >= 3
            c.publish("jobs", b"across a restart")
        server.kill()
        server.start()
        with zq.connect(server.endpoint) as c, zq.connect(server.endpoint) as other:
            with c.subscribe("jobs") as sub:
                msg = sub.get(5)
                with other.subscribe("jobs") as rival:
                    assert rival.get(1.0) is None
                assert msg.ack(wait=True) == "ok"
    finally:
        assert "Traceback" not in server.terminate()


def test_unfinished_deliveries_are_accounted_by_cause_across_a_sigkill(tmp_path):
    """A failed cancel names its error; a SIGKILL while leased counts the consumer as
    gone; the per-cause limit dead-letters the message with the whole account."""
    cfg = tmp_path / "zq.toml"
    cfg.write_text('[[queue]]\nname = "jobs"\ndead_letter = "jobs.dead"\nmax_failures = 2\n')
    server = ServerProcess(tmp_path, config=cfg).start()
    try:
        with zq.connect(server.endpoint, name="host:1 worker-a") as c:
            a = c.publish("jobs", b"poison")
            with c.subscribe("jobs") as sub:
                assert sub.get(5).cancel(error=ValueError("row 7 is not a date")) == "ok"
                sub.get(5)  # delivered again; the dispatcher dies while it is held
        server.kill()
        server.start()
        with zq.connect(server.endpoint) as c:
            doc = c.explain("jobs", a)
            causes = doc["causes"]
            assert (causes["failed"], causes["consumer_gone"], causes["cancelled"]) == (1, 1, 0), causes
            assert causes["last_error"] == "ValueError('row 7 is not a date')"
            assert causes["last_consumer"].endswith("host:1 worker-a")  # (the client puts its host:pid first)
            with zq.Worker(server.endpoint, "jobs") as w:
                msg = w.get(5)
                assert msg.deliveries == 3
                assert w.cancel_many([msg], error="still broken") == {a: "ok"}  # the second failure: dead-lettered
            with c.subscribe("jobs.dead") as dead_sub:
                dead = dead_sub.get(5)
                h = dead.headers
                assert (h["zq.reason"], h["zq.failed"], h["zq.consumer_gone"], h["zq.error"]) == \
                    ("max-failures", "2", "1", "still broken")
                assert int(h["zq.first_failure_ms"]) <= int(h["zq.last_failure_ms"])
                dead.ack()
            assert c.stats()["queues"]["jobs"]["failed"] == 1  # since this start
    finally:
        assert "Traceback" not in server.terminate()


def test_bad_errors_get_clear_answers(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        b = c.publish("jobs", b"x")
        with c.subscribe("jobs") as sub:
            msg = sub.get(5)
            with pytest.raises(TypeError, match="error"):
                msg.cancel(error=42)
            assert msg.cancel(error="x" * 100_000) == "ok"  # the client cuts it to 1,024 characters
            again = sub.get(5)
            assert c.explain("jobs", b)["causes"]["last_error"] == "x" * 1024
            again.ack()
    raw = raw_dealer(dispatcher.endpoint)
    try:
        raw.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "raw")))
        raw.send(wire.encode(wire.Publish(1, "jobs", [(b"x", {}, None)])))
        [b] = frames_until(raw, wire.Confirm).bookmarks
        raw.send(wire.encode(wire.Subscribe(2, "s", "jobs", 1)))
        assert frames_until(raw, wire.DeliverRecords).deliveries == [1]
        raw.send(wire.encode(wire.Cancel("s", [b], [1], 3, -1, "y" * 1025)))
        assert "1024" in frames_until(raw, wire.Error).message
        raw.send(wire.encode(wire.Cancel("s", [b], [1], 4, -1, "boom")))
        assert frames_until(raw, wire.Reply).data == {"ok": [b]}
    finally:
        raw.close(0)


def test_zq_consume_exec_records_why_a_command_failed(dispatcher, tmp_path):
    with zq.connect(dispatcher.endpoint) as c:
        b = c.publish("orders", b"x")
    out = subprocess.run([sys.executable, "-m", "zq.cli", "consume", "orders", "--exec", "exit 3", "--limit", "1",
                          "-e", dispatcher.endpoint], env=env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "exited 3" in out.stderr, out.stderr
    with zq.connect(dispatcher.endpoint) as c:
        causes = c.explain("orders", b)["causes"]
        assert causes["failed"] == 1 and causes["last_error"] == "`exit 3` exited 3"
