"""The periodic sync runs on the syncer's thread (zq.journal.syncer): a commit never
waits on it, a failure still fails a commit, and the directory's mark never says more
than the disk holds. A real LMDB journal; only ``env.sync`` is wrapped, to hold it or
make it fail as a slow or broken disk would."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref

import lmdb
import pytest

from zq.core import records as R
from zq.core.errors import JournalError
from zq.journal import integrity as I
from zq.journal.lmdb_journal import LmdbJournal
from zq.journal import syncer as syncer_module
from zq.journal.syncer import Syncer


class HeldSync:
    """``env`` as it is, but ``sync`` waits for ``release`` (and fails while ``failing``)."""

    def __init__(self, env) -> None:  # type: ignore[no-untyped-def]
        self._env = env
        self.release = threading.Event()
        self.release.set()
        self.started = threading.Semaphore(0)
        self.threads: list[str] = []
        self.failing = 0

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self._env, name)

    def sync(self, force: bool = False) -> None:
        self.threads.append(threading.current_thread().name)
        self.syncing = True
        self.started.release()
        try:
            if not self.release.wait(10):
                raise AssertionError("the test never released the sync")
            if self.failing:
                self.failing -= 1
                raise lmdb.Error("Input/output error")
            self._env.sync(force)
        finally:
            self.syncing = False

    syncing = False
    remapped_while_syncing = False

    def set_mapsize(self, size: int) -> None:
        self.remapped_while_syncing |= self.syncing  # (a sync starting while the map moves fails: EINVAL)
        self._env.set_mapsize(size)


def publish(j: LmdbJournal, seq: int, now_ms: int) -> None:
    j.append([R.Message(seq, 0, "t", {}, b"x")])
    j.commit(now_ms, urgent=False)


@pytest.fixture
def journal(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(I, "MARK_INTERVAL_S", 0.0)
    j = LmdbJournal(str(tmp_path / "j"), durability="batch", fsync_interval_ms=1000)
    env = HeldSync(j.env)
    j.env = env  # type: ignore[assignment]
    yield j, env
    env.release.set()
    j.close()


def test_a_periodic_sync_runs_on_its_own_thread_and_no_commit_waits_for_it(journal, tmp_path):
    j, env = journal
    env.release.clear()  # a disk that takes its time
    publish(j, 1, now_ms=5_000)  # a second since the last sync: one is due
    assert env.started.acquire(timeout=10), "no sync began"
    assert env.threads == ["zq-journal-sync"]
    for seq in range(2, 50):  # the commits go on meanwhile (a sync held the loop before)
        publish(j, seq, now_ms=5_000 + seq)
    assert I.read_mark(str(tmp_path / "j")).next < 2  # not on disk yet: the mark does not say so
    time.sleep(0.002)  # (a duration is measured: let some pass)
    assert j.sync_stats()["sync_running_ms"] > 0  # STATS shows a disk that takes its time
    env.release.set()
    assert j.syncer is not None and j.syncer.wait_idle(10)
    assert j.sync_stats()["sync_running_ms"] == 0 and j.sync_stats()["sync_last_ms"] > 0
    assert I.read_mark(str(tmp_path / "j")).next == 2  # what was committed when the sync began, no more
    publish(j, 50, now_ms=6_001)  # the next second's
    assert j.syncer.wait_idle(10)
    assert I.read_mark(str(tmp_path / "j")).next == 51
    assert env.threads == ["zq-journal-sync"] * 2


def test_a_failed_sync_fails_the_next_commit_and_the_next_syncs_are_made_in_line_until_one_works(journal):
    j, env = journal
    env.failing = 1
    publish(j, 1, now_ms=5_000)
    assert j.syncer is not None and j.syncer.wait_idle(10)
    j.append([R.Message(2, 0, "t", {}, b"x")])
    with pytest.raises(JournalError, match="journal sync failed: Input/output error"):
        j.commit(5_001, urgent=False)  # the loop pauses publishing and tries again (zq.server.loop)
    assert j.staged == [] and j.high == 3  # the commit itself was made: nothing to write again
    env.failing = 1
    with pytest.raises(JournalError, match="journal sync failed"):
        j.commit(5_201, urgent=False)  # the retry syncs here, and the disk still fails
    j.commit(5_401, urgent=False)  # it works again
    main = threading.current_thread().name
    assert env.threads == ["zq-journal-sync", main, main]
    publish(j, 3, now_ms=6_500)  # and the periodic sync is the syncer's again
    assert j.syncer.wait_idle(10)
    assert env.threads[-1] == "zq-journal-sync"


def test_a_mark_lowered_while_a_sync_runs_is_not_raised_again_by_it(journal, tmp_path):
    j, env = journal
    for seq in range(1, 11):
        j.append([R.Message(seq, 0, "t", {}, b"x")])
    env.release.clear()
    j.commit(5_000, urgent=False)
    assert env.started.acquire(timeout=10)
    j.lower_mark(6)  # a deposed leader's truncation, while the sync of 1..10 runs
    env.release.set()
    assert j.syncer is not None and j.syncer.wait_idle(10)
    assert I.read_mark(str(tmp_path / "j")).next == 6


def test_close_waits_for_the_sync_running_and_marks_where_the_journal_ends(journal, tmp_path):
    j, env = journal
    env.release.clear()
    publish(j, 1, now_ms=5_000)
    assert env.started.acquire(timeout=10)
    publish(j, 2, now_ms=5_500)  # committed after that sync began: not covered by it
    threading.Timer(0.2, env.release.set).start()
    j.close()
    assert env.threads == ["zq-journal-sync", threading.current_thread().name]  # the rest synced at close
    assert I.read_mark(str(tmp_path / "j")).next == 3


def test_the_syncer_runs_the_newest_job_asked_while_one_runs():
    syncer = Syncer("test-syncer")
    started, gate, ran = threading.Event(), threading.Event(), []
    syncer.ask(lambda: started.set() or gate.wait(10) and ran.append(1))
    assert started.wait(10)
    for i in (2, 3, 4):  # each replaces the one waiting: only the last runs
        syncer.ask(lambda i=i: ran.append(i))
    gate.set()
    assert syncer.wait_idle(10)
    assert ran == [1, 4]
    results, error = syncer.take()
    assert len(results) == 2 and error is None
    syncer.ask(lambda: 1 / 0)
    assert syncer.wait_idle(10)
    assert isinstance(syncer.take()[1], ZeroDivisionError)
    syncer.stop(10)
    with pytest.raises(RuntimeError, match="stopped"):
        syncer.ask(lambda: None)


def test_stats_say_how_long_the_periodic_sync_takes(tmp_path):
    import zq
    from zq.server.config import Config

    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=[], durability="batch")).start()
    try:
        with zq.connect(d.inproc) as c:
            before = c.stats()["server"]["journal"]
            assert before["sync_running_ms"] == 0 and before["sync_last_ms"] == 0  # none yet
            c.publish("jobs", b"x")  # the first commit that writes asks for a sync
            assert d.server is not None and d.server.journal.syncer is not None
            assert d.server.journal.syncer.wait_idle(10)
            after = c.stats()["server"]["journal"]
            assert after["sync_last_ms"] > 0 and after["sync_running_ms"] >= 0, after
    finally:
        d.stop()


def test_a_disk_slower_than_the_interval_makes_commits_wait_for_it(journal, tmp_path, caplog):
    """What an OS crash may lose stays about one interval of commits: when the next
    sync is due and the last still runs, the commit waits for it (said in the log)."""
    j, env = journal
    env.release.clear()
    publish(j, 1, now_ms=5_000)
    assert env.started.acquire(timeout=10)
    publish(j, 2, now_ms=5_500)  # within the interval: no wait
    done = threading.Event()
    caplog.set_level(logging.WARNING, logger="zq.journal.lmdb_journal")
    waiter = threading.Thread(target=lambda: (publish(j, 3, now_ms=6_001), done.set()))
    waiter.start()
    assert not done.wait(0.3), "a commit went on past a sync that has run for a whole interval"
    env.release.set()
    assert done.wait(10)
    waiter.join(10)
    assert "the disk is slow: the periodic sync has run for" in caplog.text
    assert j.syncer is not None and j.syncer.wait_idle(10)
    assert I.read_mark(str(tmp_path / "j")).next == 4


def test_the_map_never_moves_while_a_sync_runs(tmp_path):
    j = LmdbJournal(str(tmp_path / "j"), durability="batch", map_size=1 << 20)
    env = HeldSync(j.env)
    j.env = env  # type: ignore[assignment]
    try:
        env.release.clear()
        publish(j, 1, now_ms=5_000)
        assert env.started.acquire(timeout=10)
        threading.Timer(0.2, env.release.set).start()
        j.append([R.Message(seq, 0, "t", {}, b"x" * 4000) for seq in range(2, 400)])  # more than 1 MiB: the map grows
        j.commit(5_001, urgent=False)
        assert j.env.info()["map_size"] > 1 << 20 and not env.remapped_while_syncing
    finally:
        env.release.set()
        j.close()


def test_close_releases_the_journal_even_when_its_last_commit_breaks(tmp_path):
    j = LmdbJournal(str(tmp_path / "j"), durability="batch")
    publish(j, 1, now_ms=5_000)  # the syncer's thread runs
    j.append(["not a record"])
    with pytest.raises(AssertionError, match="unknown record"):
        j.close()
    again = LmdbJournal(str(tmp_path / "j"), durability="batch")  # the lock was released
    assert again.high == 2
    again.close()
    assert j.syncer is not None and not j.syncer.busy()


def test_a_failed_sync_found_at_close_is_said_and_made_again(journal, tmp_path, caplog):
    j, env = journal
    env.failing = 1
    publish(j, 1, now_ms=5_000)
    assert j.syncer is not None and j.syncer.wait_idle(10)
    caplog.set_level(logging.ERROR, logger="zq.journal.lmdb_journal")
    j.close()
    assert "the last periodic sync failed (Input/output error); syncing again at close" in caplog.text
    assert env.threads[-1] == threading.current_thread().name  # made again, here
    assert I.read_mark(str(tmp_path / "j")).next == 2


def test_a_journal_never_closed_leaves_no_thread_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(syncer_module, "IDLE_S", 0.05)
    monkeypatch.setattr(I, "MARK_INTERVAL_S", 0.0)
    j = LmdbJournal(str(tmp_path / "j"), durability="batch")
    publish(j, 1, now_ms=5_000)
    assert j.syncer is not None and j.syncer.wait_idle(10)
    syncer, ref = j.syncer, weakref.ref(j)
    deadline = time.monotonic() + 10
    while any(t.name == "zq-journal-sync" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the syncer's thread never ended"
        time.sleep(0.01)
    publish(j, 2, now_ms=6_001)  # the next sync starts another
    assert syncer.wait_idle(10) and I.read_mark(str(tmp_path / "j")).next == 3
    j.env.close()  # (what close() would do; dropped without it, the journal is collected)
    j.release_lock()
    j.closed = True
    del j
    gc.collect()
    assert ref() is None


class ThreadsThatFailOnce:
    """``threading`` as it is, but the first thread the syncer starts cannot start
    (a process at its thread limit)."""

    def __init__(self) -> None:
        self.failed = False
        self.Lock, self.Condition = threading.Lock, threading.Condition
        outer = self

        class Thread(threading.Thread):
            def start(self) -> None:
                if not outer.failed:
                    outer.failed = True
                    raise RuntimeError("can't start new thread")
                super().start()

        self.Thread = Thread


def test_a_sync_thread_that_cannot_start_makes_the_sync_in_line(journal, tmp_path, monkeypatch, caplog):
    j, env = journal
    monkeypatch.setattr(syncer_module, "threading", ThreadsThatFailOnce())
    caplog.set_level(logging.WARNING, logger="zq.journal.lmdb_journal")
    publish(j, 1, now_ms=5_000)  # returns: synced here instead
    assert env.threads == [threading.current_thread().name]
    assert "the periodic sync runs in line: can't start new thread" in caplog.text
    assert j.syncer is not None and not j.syncer.busy()
    publish(j, 2, now_ms=6_001)  # the next one starts its thread
    assert j.syncer.wait_idle(10) and env.threads[-1] == "zq-journal-sync"
    assert I.read_mark(str(tmp_path / "j")).next == 3


def test_fsync_durability_makes_every_sync_in_line(tmp_path):
    """A write-back error is told to one fdatasync only: with fsync durability it must be
    the one a confirmation waits on, so no sync runs beside it."""
    j = LmdbJournal(str(tmp_path / "j"), durability="fsync")
    env = HeldSync(j.env)
    j.env = env  # type: ignore[assignment]
    try:
        publish(j, 1, now_ms=5_000)  # not urgent (an ack's), a second since the last: synced, here
        j.append([R.Message(2, 0, "t", {}, b"x")])
        j.commit(5_001)  # urgent (a confirmation waits): here
        assert env.threads == [threading.current_thread().name] * 2 and j.syncer is None
    finally:
        j.close()


def test_the_metrics_read_the_sync_now_not_at_the_last_heartbeat(journal):
    """While a slow disk makes commits wait, the loop takes no new snapshot: the metrics
    endpoint reads the sync's figures itself."""
    from types import SimpleNamespace

    from zq.server.loop import Server

    j, env = journal
    env.release.clear()
    publish(j, 1, now_ms=5_000)
    assert env.started.acquire(timeout=10)
    time.sleep(0.002)  # (a duration is measured: let some pass)
    taken_before = {"server": {"journal": {"writable": True, "sync_running_ms": 0.0, "sync_last_ms": 0.0}}}
    server = SimpleNamespace(snapshot=taken_before, journal=j)
    assert Server.metrics_snapshot(server)["server"]["journal"]["sync_running_ms"] > 0, env.threads  # type: ignore[arg-type, index]
    assert taken_before["server"]["journal"]["sync_running_ms"] == 0.0  # (the snapshot itself is not changed)
    env.release.set()
