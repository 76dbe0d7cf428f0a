"""The journal alone, per record: ``python -m bench.journal [ROUNDS]``.

What the journal's own work costs, apart from the engine and the sockets: commits of
100 messages (200-byte payloads), a recovery-style scan, deliveries read back from disk
(not the last two commits', which come from memory), and range reads (standbys, Spark).
CPU time (``time.process_time``), best of ROUNDS (default 3): CPU time moves less than
wall time on a shared machine. To see what a change costs, run it on both trees in
turn (e.g. ``git worktree`` or ``git archive`` the old one, ``PYTHONPATH=`` it)."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

from zq.core import records as R
from zq.journal.lmdb_journal import LmdbJournal
from zq.journal.ranges import select_records


def once(n: int = 200_000, batch: int = 100, size: int = 200) -> tuple[float, float, float, float]:
    d = tempfile.mkdtemp()
    try:
        j = LmdbJournal(d, durability="none")
        payload = b"x" * size
        msgs = [R.Message(i, 1_700_000_000_000 + i, "jobs", {"k": "v"}, payload) for i in range(1, n + 1)]
        t = time.process_time()
        for i in range(0, n, batch):
            j.append(msgs[i : i + batch])
            j.commit(0)
        commit = (time.process_time() - t) / n * 1e6
        del msgs
        t = time.process_time()
        for _ in j.read_messages(0):
            pass
        scan = (time.process_time() - t) / n * 1e6
        j.recent, j.recent_before = {}, {}
        seqs = list(range(1, n + 1, 7))
        t = time.process_time()
        for i in range(0, len(seqs), 16):
            j.get_raw(seqs[i : i + 16])
        get_raw = (time.process_time() - t) / len(seqs) * 1e6
        t = time.process_time()
        got, start, done = 0, 0, False
        while not done:
            raws, start, done = select_records(j, "messages", start, None)
            got += len(raws)
        ranges = (time.process_time() - t) / got * 1e6
        j.close()
        return commit, scan, get_raw, ranges
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    runs = [once() for _ in range(rounds)]
    best = [min(r[i] for r in runs) for i in range(4)]
    print("journal, CPU us per record (best of %d): commit %.2f  recovery scan %.2f  delivery read from disk %.2f  "
          "range read %.2f" % (rounds, *best))


if __name__ == "__main__":
    main()
