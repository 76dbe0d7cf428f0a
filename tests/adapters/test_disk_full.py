"""A full disk under a real `zq serve` (a small tmpfs): publishers get a clear error,
consumers keep their sessions and leases, nothing unconfirmed is confirmed, and
publishing resumes by itself once space is freed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import zq
from zq.core.errors import JournalError
from zq.client.worker import Worker

from .support import ServerProcess, wait_until


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_pauses_publishing_with_its_cause_and_resumes_when_space_is_freed(small_fs):
    filler = small_fs / "filler"
    filler.write_bytes(b"\0" * (4 * 2**20))  # leave ~2 MiB for the journal
    server = ServerProcess(small_fs).start()
    c = zq.connect(server.endpoint)
    try:
        with Worker(server.endpoint, "jobs", max_backlog=2) as w:
            c.publish("jobs", "held")
            held = w.get(timeout=10)
            assert held is not None and held.deliveries == 1
            confirmed: list[int] = [held.bookmark]
            error = None
            for _ in range(2000):  # bounded: 2 MiB fills in a few hundred
                try:
                    confirmed += c.publish_many("jobs", [b"x" * 4000] * 20, timeout=10)
                except JournalError as exc:  # at once, naming the cause: never a timeout
                    error = exc
                    break
                w.heartbeat()
            assert error is not None, "the disk never filled"
            assert "journal disk full" in str(error)
            with pytest.raises(JournalError, match="journal disk full"):
                c.publish("jobs", "while full", timeout=5)
            w.heartbeat()
            st = c.stats()
            assert st["server"]["journal"]["writable"] is False
            assert "disk full" in st["server"]["journal"]["cause"]
            held.ack()  # the consumer's session and lease outlived the full disk
            w.heartbeat()
            os.unlink(filler)
            resumed = wait_until(lambda: _try_publish(c, w), timeout=20, what="publishing to resume by itself")
            confirmed.append(resumed)
            seen = {held.bookmark}
            deadline = time.monotonic() + 60
            while not set(confirmed) <= seen and time.monotonic() < deadline:
                for m in w.get_many(64, timeout=1.0):
                    seen.add(m.bookmark)
                    m.ack()
            missing = set(confirmed) - seen
            assert not missing, f"{len(missing)} confirmed messages never delivered"
        st = c.stats()
        assert st["server"]["journal"]["writable"] is True
        assert st["queues"]["jobs"]["redelivered"] == 0  # no session was reset on the way
    finally:
        c.close()
        err = server.terminate()
    assert "Traceback" not in err, err[-3000:]


def _try_publish(c, w) -> int | None:  # type: ignore[no-untyped-def]
    w.heartbeat()
    try:
        return c.publish("jobs", "resumed", timeout=2)
    except JournalError:
        return None


@pytest.fixture
def read_only_dir(tmp_path):
    """A journal directory on a read-only bind mount (as root ignores permission bits)."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    done = subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {done.stderr.strip()}")
    try:
        yield src, ro
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def make_read_only(ro) -> None:  # type: ignore[no-untyped-def]
    subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True, capture_output=True)


def test_a_read_only_journal_directory_is_refused_in_one_line_and_still_reads(read_only_dir):
    """Linux refuses to make a mount read-only while a journal is open for writing on it
    (EBUSY), so the fault is met at start: a clear refusal, and `zq journal` reads it."""
    src, ro = read_only_dir
    server = ServerProcess(src).start()
    with zq.connect(server.endpoint) as c:
        c.publish("jobs", "kept")
    server.terminate()
    make_read_only(ro)
    for data in (ro / "journal", ro / "fresh"):
        done = subprocess.run([sys.executable, "-m", "zq.cli", "serve", "--data", str(data), "--bind", "tcp://127.0.0.1:0"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 1, done
        assert "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines() == [
            f"zq: cannot write the journal at {data}: Read-only file system "
            "(zq serve writes there; `zq journal` commands only read)"]
    verify = subprocess.run([sys.executable, "-m", "zq.cli", "journal", "verify", "--data", str(ro / "journal")], capture_output=True, text=True,
                            timeout=30)
    assert verify.returncode == 0 and '"ok": true' in verify.stdout, verify
