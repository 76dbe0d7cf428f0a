"""The chaos harness (zq.testing.chaos): its checker caught planted violations, and a
short seeded run of real processes under faults ends with none."""

from __future__ import annotations

import os
import random

import pytest

from zq.core import records as R
from zq.journal.lmdb_journal import LmdbJournal
from zq.testing.chaos import Chaos, Figures, check_journal

# ---------------------------------------------------------------- the checker


def journal(tmp_path, events: list[tuple[str, str, str, list[int], list[int]]], groups: dict[int, str]) -> str:
    """Messages 1..6 on topic/queue 'seq' (groups as given), then the events in order."""
    path = str(tmp_path / "j")
    j = LmdbJournal(path)
    j.append([R.Message(b, 0, "seq", {"group": groups[b]} if b in groups else {}, b"x", None) for b in range(1, 7)])
    j.append([R.Event(100 + i, 0, kind, q, consumer, bms, ds) for i, (kind, q, consumer, bms, ds) in enumerate(events)])
    j.commit()
    j.close()
    return path


CLEAN = [(R.LEASED, "seq", "c1", [1], [1]), (R.ACKED, "seq", "c1", [1], [1]),
         (R.LEASED, "seq", "c2", [2], [1]), (R.LEASE_EXPIRED, "seq", "", [2], [1]),
         (R.LEASED, "seq", "c1", [2], [2]), (R.ACKED, "seq", "c1", [2], [2])]


def violations(tmp_path, events, groups=None, confirmed=(1, 2), boundaries=()):  # type: ignore[no-untyped-def]
    path = journal(tmp_path, events, groups or {1: "A", 2: "A"})
    return check_journal(path, {b: "seq" for b in confirmed}, list(boundaries), Figures(0))


def test_a_clean_history_has_no_violation(tmp_path):
    assert violations(tmp_path, CLEAN) == []


@pytest.mark.parametrize(("events", "words"), [
    (CLEAN + [(R.LEASED, "seq", "c2", [1], [2])], "after it was acknowledged"),
    ([(R.LEASED, "seq", "c1", [1], [1]), (R.LEASED, "seq", "c2", [1], [2]), (R.ACKED, "seq", "c2", [1], [2]),
      (R.LEASED, "seq", "c1", [2], [1]), (R.ACKED, "seq", "c1", [2], [1])], "never ended"),
    ([(R.LEASED, "seq", "c1", [1], [1]), (R.LEASED, "seq", "c2", [2], [1]), (R.ACKED, "seq", "c1", [1], [1]),
      (R.ACKED, "seq", "c2", [2], [1])], "while"),
    ([(R.LEASED, "seq", "c1", [2], [1]), (R.ACKED, "seq", "c1", [2], [1]), (R.LEASED, "seq", "c1", [1], [1]),
      (R.ACKED, "seq", "c1", [1], [1])], "waits"),
    (CLEAN[:4], "lost"),
])
def test_each_planted_violation_is_reported(tmp_path, events, words):
    found = violations(tmp_path, events)
    assert any(words in v for v in found), found


def test_a_server_restart_ends_the_leases_it_held(tmp_path):
    events = [(R.LEASED, "seq", "c1", [1], [1]), (R.LEASED, "seq", "c2", [1], [2]), (R.ACKED, "seq", "c2", [1], [2]),
              (R.LEASED, "seq", "c2", [2], [1]), (R.ACKED, "seq", "c2", [2], [1])]
    assert violations(tmp_path, events, boundaries=[101]) == []  # the restart before event 101


# ---------------------------------------------------------------- a short run


def test_a_short_seeded_chaos_run_ends_with_no_violation(tmp_path):
    seed = int(os.environ.get("ZQ_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    faults = int(os.environ.get("ZQ_CHAOS_FAULTS", "24"))
    print(f"chaos seed {seed} (rerun: ZQ_CHAOS_SEED={seed})")
    chaos = Chaos(tmp_path, seed)
    if not chaos.tmpfs:
        print("no tmpfs could be mounted here (needs root): the disk-full faults are left out of this run")
    try:
        figures = chaos.run(faults, time_limit=240)
    finally:
        chaos.close()
    print(figures.line())
    assert figures.violations == [], f"seed {seed}: {figures.violations[:10]}"
    assert figures.confirmed > 0 and figures.faults["server-kill"] + figures.faults["worker-kill"] > 0
