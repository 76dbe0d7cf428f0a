"""A standby over real sockets: `zq standby` copies a running `zq serve`'s journal
record for record; after the leader is SIGKILLed, `zq serve` on the standby's
directory serves what the leader had (the unacked messages, their delivery counts,
run-time queues, dead letters, message ids); a standby waits for a leader that is not
there yet; one that the leader's retention left behind stops with a clear message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import zq
from zq.journal import replica
from zq.journal.lmdb_journal import LmdbJournal
from zq.server.standby import Standby, StandbyError

from .support import ServerProcess, env, wait_until


def start_standby(leader: str, data: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zq.cli", "standby", leader, "--data", str(data), "--status-every",
                             "0.5", *extra], env=env(), stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()  # its own pid
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def position_of(data: Path) -> int:
    j = LmdbJournal(str(data), readonly=True)
    try:
        return replica.position(j)
    finally:
        j.close()


def caught_up(leader: str, data: Path) -> bool:
    with zq.connect(leader) as c:
        end = c.bounds()["next_seq"]
    return data.exists() and position_of(data) >= end


def test_a_promoted_standby_serves_what_the_sigkilled_leader_had(tmp_path):
    cfg = tmp_path / "zq.toml"
    cfg.write_text('[[queue]]\nname = "jobs"\nlease = "60s"\nmax_failures = 1\ndead_letter = "jobs.dead"\n')
    leader = ServerProcess(tmp_path / "a", config=cfg)
    (tmp_path / "a").mkdir()
    leader.start()
    standby_dir = tmp_path / "b" / "journal"
    follower = start_standby(leader.endpoint, standby_dir, "--batch", "500")  # several rounds to catch up
    try:
        with zq.connect(leader.endpoint) as c:
            c.create_queue("reports", lease="5s")
            sent = c.publish_many("jobs", [b"job %d" % i for i in range(3000)])
            rid = c.publish("reports", b"weekly", msg_id="week-47")
            with c.subscribe("jobs", max_backlog=20) as s:
                acked = []
                for _ in range(20):
                    m = s.get(5)
                    m.ack()
                    acked.append(m.bookmark)
                failed = s.get(5)
                failed.cancel(error="bad row")  # its only delivery: dead-lettered
                held = s.get(5)  # leased when the leader dies
            wait_until(lambda: caught_up(leader.endpoint, standby_dir), timeout=60, interval=0.2,
                       what="the standby caught up")
            held_bookmark = held.bookmark
        leader.kill()
        err = stop(follower)
        assert "Traceback" not in err and "zq standby of" in err, err
        promoted = ServerProcess(tmp_path / "b", config=cfg).start()
        try:
            with zq.connect(promoted.endpoint) as c:
                stats = c.stats()["queues"]
                waiting = len(sent) - len(acked) - 1  # (the failed one went to the dead letters)
                assert stats["jobs"]["depth"] == waiting
                assert stats["jobs.dead"]["depth"] == 1
                assert {q["name"] for q in c.queues()} >= {"jobs", "jobs.dead", "reports"}
                assert c.publish("reports", b"weekly again", msg_id="week-47") == rid  # the id index came along
                doc = c.explain("jobs", held_bookmark)
                assert doc["state"] == "waiting" and doc["deliveries"] == 1
                with c.subscribe("jobs", max_backlog=500) as s:
                    got = []
                    while len(got) < waiting:
                        m = s.get(10)
                        assert m is not None, f"only {len(got)} of {waiting} came back"
                        got.append(m.bookmark)
                        m.ack()
                assert not set(got) & set(acked)  # nothing acked on the leader is delivered again
                assert sorted(got) == sorted(set(sent) - set(acked) - {failed.bookmark})
        finally:
            assert "Traceback" not in promoted.terminate()
    finally:
        if follower.poll() is None:
            stop(follower)


def test_a_standby_waits_for_its_leader_and_then_catches_up(tmp_path):
    leader = ServerProcess(tmp_path)
    standby_dir = tmp_path / "copy"
    follower = start_standby(leader.endpoint, standby_dir)
    try:
        wait_until(standby_dir.exists, what="the standby's journal")  # it runs, before its leader does
        assert follower.poll() is None
        leader.start()
        with zq.connect(leader.endpoint) as c:
            c.publish_many("jobs", [b"x"] * 100)
        wait_until(lambda: caught_up(leader.endpoint, standby_dir), timeout=60, interval=0.2,
                   what="the standby caught up")
    finally:
        err = stop(follower)
        assert "Traceback" not in leader.terminate()
    assert "Traceback" not in err


def test_a_standby_left_behind_by_retention_says_so(tmp_path):
    """Copy some, then the leader goes on, acknowledges everything and its retention
    deletes records the standby never copied: the standby cannot go on, and says why."""
    leader = ServerProcess(tmp_path).start()
    copy_dir = tmp_path / "copy"
    with zq.connect(leader.endpoint) as c:
        c.publish_many("jobs", [b"x"] * 10)
    first = Standby(leader.endpoint, str(copy_dir))
    first.run(rounds=1)
    at = first.state.position
    with zq.connect(leader.endpoint) as c:
        c.publish_many("jobs", [b"x"] * 10)
        with c.subscribe("jobs", max_backlog=100) as s:
            for _ in range(20):
                s.get(5).ack()
    assert "Traceback" not in leader.terminate()
    j = LmdbJournal(str(tmp_path / "journal"))
    try:
        assert j.trim(at + 5, 1 << 62) > 0  # as the leader's retention would, past the standby's position
    finally:
        j.close()
    leader.start()
    try:
        again = Standby(leader.endpoint, str(copy_dir))
        assert again.state.position == at
        with pytest.raises(StandbyError, match="cannot catch up"):
            again.run(rounds=1)
        done = subprocess.run([sys.executable, "-m", "zq.cli", "standby", leader.endpoint, "--data", str(copy_dir)],
                              env=env(), capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and "cannot catch up" in done.stderr and "Traceback" not in done.stderr
    finally:
        assert "Traceback" not in leader.terminate()


def test_bad_standby_arguments_are_usage_errors(tmp_path):
    for args, says in ((["not-an-endpoint"], "endpoint"), (["tcp://127.0.0.1:1", "--batch", "0"], "--batch")):
        done = subprocess.run([sys.executable, "-m", "zq.cli", "standby", *args, "--data", str(tmp_path / "x")],
                              env=env(), capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
