"""The LMDB journal with a real environment in a temp dir."""

import os
import signal
import subprocess
import sys
import time

import pytest

from zq.core import QueueSettings
from zq.core import inventory
from zq.core import records as R
from zq.core.errors import JournalError
from zq.journal.base import recover_engine
from zq.journal.integrity import sound, unseal
from zq.journal.lmdb_journal import LmdbJournal

from ..core.helpers import Harness




def test_messages_events_and_queue_state_round_trip(tmp_path):
    settings = QueueSettings(name="jobs", dead_letter="jobs.failed", max_cancels=1)
    j = LmdbJournal(str(tmp_path))
    h = Harness(settings)
    a = h.pub("jobs")[0]
    b = h.pub("jobs", group="g1")[0]
    h.sub("s", "jobs", 5)
    h.commit_to(j)
    assert h.engine.ack("s", [a], 1) == []
    assert h.engine.cancel("s", [b], 1) == []
    h.commit_to(j)
    j.close()

    j = LmdbJournal(str(tmp_path))
    assert j.counts()["messages"] == 3  # two published, one dead letter
    dead = [m for m in j.read_messages(0) if m.topic == "jobs.failed"]
    assert len(dead) == 1
    assert dead[0].payload == b"m" and dead[0].headers["group"] == "g1"
    assert dead[0].headers["zq.reason"] == "max-cancels" and dead[0].headers["zq.topic"] == "jobs"
    kinds = [e.kind for e in j.read_events(0)]
    assert kinds[:1] == [R.LEASED] and R.ACKED in kinds and R.EXPIRED in kinds
    engine = recover_engine(j, [settings])
    assert engine.queues["jobs"].depth == 0 and engine.queues["jobs.failed"].depth == 1


def test_get_messages_returns_payloads_for_delivery(tmp_path):
    j = LmdbJournal(str(tmp_path))
    h = Harness()
    seqs = [h.engine.publish("t", f"p{i}".encode(), {"k": "v"}, 0) for i in range(5)]
    h.commit_to(j)
    assert [m.payload for m in j.get_messages(seqs[1:3])] == [b"p1", b"p2"]
    with pytest.raises(JournalError, match="not in the journal"):
        j.get_messages([999])


def test_raw_records_for_delivery_are_the_stored_bytes_whether_just_written_or_older(tmp_path):
    j = LmdbJournal(str(tmp_path), map_size=64 * 1024)  # small: the third commit grows the map and retries
    h = Harness()
    steps = []
    for step in range(3):
        steps.append([h.engine.publish("t", bytes([step]) * 600, {"step": str(step)}, 0) for _ in range(40)])
        h.commit_to(j)
    every = [s for step in steps for s in step]
    mixed = [steps[2][0], steps[0][5], steps[1][3], steps[2][39]]  # last commit, older, the one before
    with j.env.begin(db=j.msgs) as txn:
        sealed = {s: txn.get(s.to_bytes(8, "big")) for s in every}
    assert all(sound(v) for v in sealed.values())  # stored sealed: the wire carries them without the checksum
    stored = {s: unseal(v) for s, v in sealed.items()}
    assert [bytes(r) for r in j.get_raw(mixed)] == [stored[s] for s in mixed]
    assert [bytes(r) for r in j.get_raw(every)] == [stored[s] for s in every]
    assert R.message_decoder.decode(bytes(j.get_raw([steps[2][7]])[0])).payload == b"\x02" * 600
    with pytest.raises(JournalError, match="not in the journal"):
        j.get_raw([every[-1] + 1000])


def test_a_newer_journal_format_is_refused_with_a_clear_message(tmp_path):
    j = LmdbJournal(str(tmp_path))
    with j.env.begin(db=j.meta, write=True) as txn:
        txn.put(b"format", b"99")
    j.close()
    with pytest.raises(JournalError, match="format 99, newer than this zq"):
        LmdbJournal(str(tmp_path))


def test_an_unknown_durability_is_refused(tmp_path):
    with pytest.raises(JournalError, match="durability"):
        LmdbJournal(str(tmp_path), durability="sometimes")


@pytest.mark.parametrize("durability", ["fsync", "batch", "none"])
def test_every_durability_mode_commits_readable_records(tmp_path, durability):
    j = LmdbJournal(str(tmp_path), durability=durability)
    h = Harness()
    h.pub("t", 10)
    h.commit_to(j)
    assert sum(1 for _ in j.read_messages(0)) == 10
    assert (j.unsynced is False) if durability == "fsync" else True


def test_a_full_map_grows_instead_of_failing(tmp_path):
    j = LmdbJournal(str(tmp_path), map_size=64 * 1024)
    h = Harness()
    for _ in range(20):
        for _ in range(50):
            h.engine.publish("t", b"x" * 1000, {}, 0)
        h.commit_to(j)
    assert j.counts()["messages"] == 1000
    assert j.env.info()["map_size"] > 64 * 1024


def test_retention_deletes_only_old_records_below_the_recovery_point(tmp_path):
    settings = QueueSettings(name="jobs", max_per_subscription_backlog=100)
    j = LmdbJournal(str(tmp_path))
    h = Harness(settings)
    old = h.pub("jobs", 10)
    h.now = 10_000
    young = h.pub("jobs", 10)
    h.sub("s", "jobs", 100)
    h.commit_to(j)
    h.engine.ack("s", old + young[:5], h.now)
    h.commit_to(j)
    rp = h.engine.min_recovery_point()
    assert rp == young[5]
    j.trim(rp, older_than_ms=5_000)  # only the old ten are both old and finished
    remaining = [m.seq for m in j.read_messages(0)]
    assert remaining == young
    j.trim(rp, older_than_ms=20_000)
    assert [m.seq for m in j.read_messages(0)] == young[5:]


def test_a_journal_emptied_by_retention_does_not_number_from_one_again(tmp_path):
    """Found while building standbys: when retention deleted every record, a restart
    numbered from 1 again, so old bookmarks (in clients' hands, in a standby's
    position) named new messages. The journal keeps the floor."""
    j = LmdbJournal(str(tmp_path))
    h = Harness(QueueSettings(name="jobs"))
    seqs = h.pub("jobs", 5)
    h.sub("s", "jobs", 10)
    h.commit_to(j)
    h.engine.ack("s", seqs, h.now)
    h.commit_to(j)
    end = j.next_seq()
    assert j.trim(end, older_than_ms=1 << 62) == end - 1  # everything
    assert j.counts() == {"messages": 0, "events": 0}
    assert j.next_seq() == end
    j.close()
    j = LmdbJournal(str(tmp_path))
    try:
        assert j.next_seq() == end  # after a restart too
    finally:
        j.close()


def test_a_long_scan_reads_in_chunks_without_losing_records(tmp_path):
    j = LmdbJournal(str(tmp_path))
    h = Harness()
    h.pub("t", 250)
    h.commit_to(j)
    seqs = [m.seq for m in j.scan(j.msgs, R.message_decoder.decode, 0, None, chunk=7)]
    assert seqs == list(range(1, 251))
    assert [m.seq for m in j.read_messages(100, 110)] == list(range(100, 110))


def test_a_writer_killed_with_sigkill_loses_nothing_it_reported_durable(tmp_path):
    """Kill a real writer process mid-stream; reopen; check the invariants."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.journal.crash_writer", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env=env, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    confirmed, acked = set(), set()
    deadline = time.monotonic() + 30
    try:
        while len(confirmed) < 3000:
            line = proc.stdout.readline()
            assert line, f"writer exited early with {proc.poll()}"
            assert time.monotonic() < deadline, "writer too slow"
            _, c, _, a = (line.rstrip("\n") + " ").split(" ")[:4]
            confirmed.update(int(x) for x in c.split(",") if x)
            acked.update(int(x) for x in a.split(",") if x)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    # The writer ran on between the last line read and the kill: its acks there are
    # durable too (once, a loaded CI machine made this test report them as lost).
    for line in proc.stdout.read().splitlines():
        _, c, _, a = (line + " ").split(" ")[:4]
        acked.update(int(x) for x in a.split(",") if x)

    j = LmdbJournal(str(tmp_path))
    events = list(j.read_events(0))  # and acks committed in the instant before a line was written
    journal_acked = {b for e in events if e.kind == R.ACKED for b in e.bookmarks}
    assert journal_acked >= acked, "an ack the writer reported durable is not in the journal"
    engine = recover_engine(j, [QueueSettings(name="jobs", max_per_subscription_backlog=64, lease_ms=10**9)])
    q = engine.queues["jobs"]
    waiting = inventory.waiting_set(q)
    assert not (waiting & journal_acked), "an acked message came back after the crash"
    missing = confirmed - journal_acked - waiting
    assert not missing, f"confirmed messages lost: {sorted(missing)[:10]}"
    # group order: within each group, waiting messages are in publish order
    order = list(inventory.waiting(q))
    assert order == sorted(order)


def test_fsync_mode_syncs_urgent_commits_at_once_and_lets_others_wait_for_the_interval(tmp_path):
    j = LmdbJournal(str(tmp_path), durability="fsync", fsync_interval_ms=1000)
    h = Harness()
    h.pub("t")
    h.drain()
    j.append(h.records)
    j.commit(0, urgent=True)
    assert j.unsynced is False
    j.append([R.Event(99, 0, R.ACKED, "t", "w", [1], [1])])
    j.commit(10, urgent=False)
    assert j.unsynced is True  # an ack rides on the next sync
    j.commit(1000, urgent=False)
    assert j.unsynced is False  # ... at most fsync_interval later


def test_read_raw_stops_after_the_record_that_reaches_max_bytes(tmp_path):
    """The replays' pump bounds what it reads a turn in bytes (zq.server.replay)."""
    from tests.core.helpers import Harness
    from zq.journal.lmdb_journal import LmdbJournal

    j = LmdbJournal(str(tmp_path / "j"))
    try:
        h = Harness()
        h.pub("t", 10, payload=b"p" * 1000)
        h.commit_to(j)
        everything = j.read_raw(0, 100)
        assert len(everything) == 10
        size = len(everything[0][1])
        assert j.read_raw(0, 100, 1) == everything[:1]  # the first always comes
        assert j.read_raw(0, 100, 3 * size) == everything[:3]
        assert j.read_raw(0, 100, 3 * size + 1) == everything[:4]
        assert j.read_raw(everything[5][0], 2, 10**9) == everything[5:7]  # the record count still bounds it
    finally:
        j.close()
