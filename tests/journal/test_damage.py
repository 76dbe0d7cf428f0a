"""A damaged journal on real files (docs/reliability.md, "Journal integrity"): every
case ends in a refusal naming the damage, or in a correct recovery; never in an empty
journal started in silence, a SIGBUS or a raw LMDB error.

Truncations are checked before LMDB maps the file (a file shorter than its meta pages
say would be a SIGBUS at the first read past its end: these tests would die, not fail).
The command-line side (a real `zq serve`, `zq journal verify`) is
tests/adapters/test_journal_damage.py."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat

import lmdb
import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.errors import JournalError
from zq.journal import integrity as I
from zq.journal import replica
from zq.journal.integrity import JournalDamaged
from zq.journal.lmdb_journal import LmdbJournal, key
from zq.journal.ranges import select_records
from zq.journal.salvage import recover
from zq.journal.tools import export, info, repair, reset, verify

from .damage_files import (PAGE, build, current_meta, damage_pages, event_key, flip, flip_everywhere, leaf_pages_of,
                           marker, message_key, meta, msgs_root, truncate)


@pytest.fixture
def built(tmp_path):
    return build(tmp_path / "j")


def recovered(path, queues=()) -> dict[str, int]:  # type: ignore[no-untyped-def]
    j = LmdbJournal(str(path))
    try:
        return {name: q.depth for name, q in recover(j, list(queues)).queues.items()}
    finally:
        j.close()


def refused(path, *, readonly: bool = False) -> str:
    """The sentence opening and recovering the journal ends in (it must end in one)."""
    with pytest.raises(JournalDamaged) as caught:
        j = LmdbJournal(str(path), readonly=readonly)
        try:
            recover(j, [])
        finally:
            j.close()
    return str(caught.value)


# ------------------------------------------------------------- emptiness


def test_a_journal_truncated_to_nothing_is_refused_and_never_started_empty(built):
    truncate(built.file, 0)
    for readonly in (False, True):
        msg = refused(built.path, readonly=readonly)
        assert f"journal {built.file} is empty (0 bytes) but this directory held a journal up to bookmark " \
               f"{built.next_seq - 1}" in msg
        assert f"`zq journal reset {built.path}`" in msg
    assert os.path.getsize(built.file) == 0  # nothing was written in its place


def test_a_missing_journal_file_is_refused(built):
    os.remove(built.file)
    msg = refused(built.path)
    assert f"journal {built.file} is missing but this directory held a journal up to bookmark" in msg
    assert not built.file.exists()


def test_an_empty_journal_file_without_a_mark_is_refused_too(built):
    """A directory from before the mark (or whose mark was lost): LMDB writes its meta
    pages as it creates data.mdb, so an empty one is a journal lost, not a new one."""
    os.remove(built.path / I.ID_FILE)
    truncate(built.file, 0)
    assert "is empty (0 bytes) but LMDB created a journal here" in refused(built.path)


def test_a_new_directory_starts_a_journal_and_marks_it(tmp_path):
    j = LmdbJournal(str(tmp_path / "new"))
    j.append([R.Message(1, 0, "t", {}, b"x")])
    j.commit(0)
    j.close()
    mark = json.loads((tmp_path / "new" / I.ID_FILE).read_text())
    assert mark["next"] == 2 and mark["journal"] == info(str(tmp_path / "new"))["journal_id"]


def test_reset_starts_anew_on_purpose_and_keeps_the_old_files_aside(built):
    truncate(built.file, 0)
    out = reset(str(built.path))
    assert sorted(os.listdir(out["moved_aside"])) == ["data.mdb", "journal.id", "lock.mdb"]
    assert recovered(built.path, [QueueSettings(name="jobs")]) == {"jobs": 0}  # a new, empty journal: on purpose this time
    j = LmdbJournal(str(built.path), readonly=True)
    assert j.next_seq() == 1
    j.close()


def test_an_older_copy_put_in_place_is_refused_and_can_be_kept_on_purpose(built, tmp_path):
    """A backup restored by mistake (or the older meta page chosen) holds fewer records
    than the directory's mark: refused, naming both ends; `reset --keep` accepts it."""
    older = tmp_path / "older"
    j = LmdbJournal(str(older))
    j.append([R.Message(1, 0, "jobs", {}, b"x")])
    j.commit(0)
    j.close()
    shutil.copy(older / "data.mdb", built.file)
    msg = refused(built.path)
    assert "is not the journal this directory held" in msg and "`zq journal reset --keep" in msg
    # the same journal, only shorter (its id is the same): the mark names what is missing
    with lmdb.open(str(older), max_dbs=5) as env:
        with env.begin(write=True, db=env.open_db(b"meta")) as txn:
            txn.put(b"journal:id", json.loads((built.path / I.ID_FILE).read_text())["journal"].encode())
    shutil.copy(older / "data.mdb", built.file)
    msg = refused(built.path)
    assert f"ends at bookmark 1 but this directory held it up to bookmark {built.next_seq - 1}: records are missing" in msg
    assert info(str(built.path))["problem"].startswith(f"journal {built.file} ends at bookmark 1")
    reset(str(built.path), keep=True)
    assert recovered(built.path, [QueueSettings(name="jobs")]) == {"jobs": 1}
    j = LmdbJournal(str(built.path), readonly=True)
    assert j.next_seq() == built.next_seq  # what the lost records' bookmarks named is never named again
    j.close()


def test_the_mark_follows_the_synced_journal(tmp_path, monkeypatch):
    path = tmp_path / "j"
    j = LmdbJournal(str(path), durability="fsync")
    monkeypatch.setattr(I, "MARK_INTERVAL_S", 0.0)
    for seq in (1, 2):
        j.append([R.Message(seq, 0, "t", {}, b"x")])
        j.commit(0)
        assert I.read_mark(str(path)).next == seq + 1  # written after the sync, never before
    monkeypatch.setattr(I, "MARK_INTERVAL_S", 3600.0)
    j.append([R.Message(3, 0, "t", {}, b"x")])
    j.commit(0)
    assert I.read_mark(str(path)).next == 3  # at most every MARK_INTERVAL_S...
    j.close()
    assert I.read_mark(str(path)).next == 4  # ...and at a clean stop


def test_a_deposed_leaders_truncation_lowers_the_mark_first(built):
    j = LmdbJournal(str(built.path))
    replica.truncate_from(j, 300)
    j.close()
    assert I.read_mark(str(built.path)).next == 300
    assert recovered(built.path)["jobs"] < 300


# ------------------------------------------------------------ truncation


@pytest.mark.parametrize("size", ["half", 2 * PAGE, 5 * PAGE, PAGE + 100, 100])
def test_a_truncated_journal_is_refused_before_it_is_mapped(built, size):
    full = os.path.getsize(built.file)
    truncate(built.file, full // 2 if size == "half" else size)
    for readonly in (False, True):
        msg = refused(built.path, readonly=readonly)
        assert msg.startswith(f"journal {built.file} is truncated"), msg
    with pytest.raises(JournalDamaged, match="is truncated"):
        verify(str(built.path))
    with pytest.raises(JournalDamaged, match="is truncated"):
        select_records(LmdbJournal(str(built.path), readonly=True), "messages", 0, None)


# ------------------------------------------------------------ records


def test_a_flipped_payload_byte_is_named_at_recovery_by_verify_and_export_and_repaired(built, tmp_path):
    damaged = built.seqs[123]
    flip_everywhere(built.file, marker(123), 3)
    msg = refused(built.path)
    assert f"journal {built.file} is damaged: message records damaged at bookmarks {damaged} " in msg
    assert f"`zq journal repair {built.path}`" in msg and "nothing was served" in msg
    with pytest.raises(JournalDamaged, match=f"the message record at bookmark {damaged} is damaged"):
        LmdbJournal(str(built.path), readonly=True).get_message(damaged)
    with pytest.raises(JournalDamaged, match=f"bookmarks {damaged} are damaged"):
        select_records(LmdbJournal(str(built.path), readonly=True), "messages", 0, None)
    report = verify(str(built.path))
    assert not report["ok"] and report["damaged"] == {"messages": str(damaged)}
    counts = export(str(built.path), str(tmp_path / "out"))
    assert counts["messages"] == 599 and counts["damaged"] == {"messages": str(damaged)}
    rows = [json.loads(x) for x in (tmp_path / "out" / "messages.jsonl").read_text().splitlines()]
    assert damaged not in [r["bookmark"] for r in rows] and len(rows) == 599
    fixed = repair(str(built.path))
    assert fixed["kept"]["messages"] == 599 and fixed["damaged"] == {"messages": str(damaged)}
    assert verify(str(built.path))["ok"]
    assert recovered(built.path) == {"jobs": 599 - 10, "reports": 0}
    j = LmdbJournal(str(built.path))
    assert j.next_seq() == built.next_seq  # never numbering again below what was given out
    assert j.get_message(damaged) is None and j.get_message(built.seqs[124]).payload.startswith(marker(124))
    j.close()
    assert os.listdir(fixed["damaged_file"]) == ["data.mdb"] or "data.mdb" in os.listdir(fixed["damaged_file"])


def test_a_flipped_event_byte_is_named(built):
    j = LmdbJournal(str(built.path), readonly=True)
    ack = next(e for e in j.read_events(0) if e.kind == R.ACKED)
    j.close()
    flip_everywhere(built.file, event_key(ack.seq), 8 + 6)  # inside the record, after its tag
    msg = refused(built.path)
    assert f"event records damaged at bookmarks {ack.seq} " in msg
    assert verify(str(built.path))["damaged"] == {"events": str(ack.seq)}
    repair(str(built.path))
    assert recovered(built.path) == {"jobs": 590, "reports": 0}  # the recovery point says 1-10 are done


def test_a_flipped_key_byte_is_named_and_repair_puts_the_record_back_under_its_bookmark(built):
    seq = built.seqs[300]
    flip_everywhere(built.file, message_key(seq), 7, 0x01)  # its key's last bit
    msg = refused(built.path)
    assert f"the message record of bookmark {seq} is stored under key {seq ^ 1}" in msg
    j = LmdbJournal(str(built.path), readonly=True)
    with pytest.raises(JournalError):
        j.get_messages([seq])
    j.close()
    repair(str(built.path))
    assert verify(str(built.path))["ok"]
    j = LmdbJournal(str(built.path))
    assert j.get_message(seq).payload.startswith(marker(300))
    j.close()


def test_a_damaged_run_time_queue_record_is_named(built):
    flip_everywhere(built.file, b'"name":"reports"', 9)
    j = LmdbJournal(str(built.path), readonly=True)
    with pytest.raises(JournalDamaged, match="the declaration of run-time queue 'reports' is damaged"):
        j.declared()
    j.close()
    assert any("run-time queue 'reports'" in p for p in verify(str(built.path))["problems"])


# --------------------------------------------------------------- pages


@pytest.mark.parametrize("at", [20, 26])  # a node offset, a child page number
def test_a_damaged_branch_page_is_named_and_the_rest_is_saved(built, tmp_path, at):
    root, depth = msgs_root(built.file)
    assert depth == 2  # the messages' root is a branch page
    flip(built.file, root * PAGE + at)
    msg = refused(built.path)
    assert msg.startswith(f"journal {built.file} is damaged: the message records between bookmarks "), msg
    report = verify(str(built.path))
    assert not report["ok"] and report["damaged"]["unreadable"][0]["kind"] == "message"
    counts = export(str(built.path), str(tmp_path / "out"))
    assert 500 < counts["messages"] < 600 and "cannot be read" in counts["problem"]
    fixed = repair(str(built.path))
    assert fixed["kept"]["messages"] == counts["messages"]
    assert verify(str(built.path))["ok"]


@pytest.mark.parametrize("where,expect", [
    ("magic-0", "meta page 0 is not an LMDB meta page"),
    ("magic-1", "meta page 1 is not an LMDB meta page"),
    ("root", "its meta page names root page"),
    ("last-page", "is truncated (or its meta page is damaged)"),
    ("page-size", "page size"),
])
def test_a_damaged_meta_page_is_refused_with_what_is_wrong(built, where, expect):
    cur = current_meta(built.file)
    offset = {"magic-0": 16, "magic-1": PAGE + 16, "root": cur["offset"] + 128, "last-page": cur["offset"] + 137,
              "page-size": PAGE + 41}[where]
    flip(built.file, offset)
    for readonly in (False, True):
        assert expect in refused(built.path, readonly=readonly)


def test_the_older_meta_page_made_current_is_caught_by_the_mark(built):
    """A flipped transaction id makes LMDB take the older meta page: the journal one
    commit ago, silently. The directory's mark says what it held."""
    j = LmdbJournal(str(built.path))
    j.append([R.Message(built.next_seq, 0, "jobs", {}, b"the last commit")])
    j.commit(0)
    j.close()
    older = min((meta(built.file, 0), meta(built.file, 1)), key=lambda m: m["txnid"])
    flip(built.file, older["offset"] + 136 + 8 + 7, 0x01)  # its txnid's high byte: now the newest
    assert "records are missing" in refused(built.path)


# -------------------------------------------------------- formats, copies


def format_1_journal(path) -> list[int]:
    """A journal as zq wrote it before record checksums: records unsealed, format 1."""
    env = lmdb.open(str(path), max_dbs=5)
    enc = R.record_encoder.encode
    with env.begin(write=True) as txn:
        msgs, events = env.open_db(b"msgs", txn=txn), env.open_db(b"events", txn=txn)
        meta_db = env.open_db(b"meta", txn=txn)
        queues, _ = env.open_db(b"queues", txn=txn), env.open_db(b"ids", txn=txn)
        for seq in (1, 2, 3):
            txn.put(key(seq), enc(R.Message(seq, 1000, "jobs", {}, b"old %d" % seq)), db=msgs)
        txn.put(key(4), enc(R.Event(4, 1001, R.ACKED, "jobs", "c", [1], [1])), db=events)
        settings = QueueSettings(name="reports")
        import msgspec

        txn.put(b"reports", enc(R.QueueDeclared(msgspec.json.encode(settings), 0)), db=queues)
        txn.put(b"format", b"1", db=meta_db)
    env.close()
    return [1, 2, 3]


def test_a_format_1_journal_is_read_as_it_is_and_sealed_from_its_end_on(tmp_path):
    path = tmp_path / "old"
    format_1_journal(path)
    assert verify(str(path))["ok"] and info(str(path))["checksums_from"] is None
    j = LmdbJournal(str(path))  # written: upgraded in place
    assert j.sums_from == 5 and [d.settings_json for d in j.declared()]
    j.append([R.Message(5, 2000, "jobs", {}, b"new")])
    j.commit(0)
    assert [m.payload for m in j.read_messages(0)] == [b"old 1", b"old 2", b"old 3", b"new"]
    raws, _, _ = select_records(j, "messages", 0, None)
    assert [R.message_decoder.decode(r).seq for r in raws] == [1, 2, 3, 5]
    j.close()
    assert info(str(path))["format"] == 2 and info(str(path))["checksums_from"] == 5
    assert recovered(path, [QueueSettings(name="jobs")]) == {"jobs": 3, "reports": 0}
    flip_everywhere(path / "data.mdb", b"new", 1)
    assert "message records damaged at bookmarks 5 " in refused(path)


def test_a_standbys_copy_is_sealed_like_the_leaders_and_a_damaged_leader_record_stops_the_copy(built, tmp_path):
    leader = LmdbJournal(str(built.path), readonly=True)
    end = leader.next_seq()
    msgs, _, _ = select_records(leader, "messages", 0, end)
    events, _, _ = select_records(leader, "events", 0, end)
    copy = LmdbJournal(str(tmp_path / "copy"))
    replica.apply(copy, msgs, events, end, leader.declared_raw(), leader.recovery_points())
    with leader.env.begin() as a, copy.env.begin() as b:
        assert list(a.cursor(db=leader.msgs)) == list(b.cursor(db=copy.msgs))  # the same sealed bytes
        assert list(a.cursor(db=leader.queues)) == list(b.cursor(db=copy.queues))
    copy.close()
    leader.close()
    assert verify(str(tmp_path / "copy"))["ok"]
    flip_everywhere(built.file, marker(5), 2)
    leader = LmdbJournal(str(built.path), readonly=True)
    with pytest.raises(JournalDamaged, match=f"message records at bookmarks {built.seqs[5]} are damaged"):
        select_records(leader, "messages", 0, end)
    leader.close()


# ------------------------------------------------------------ privacy


FILES = ("data.mdb", "lock.mdb", "journal.id", "zq.lock")


@pytest.mark.parametrize("umask", [0o002, 0o277])
def test_journal_files_are_the_owners_alone_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        j = LmdbJournal(str(tmp_path / "j"))
        j.append([R.Message(1, 0, "t", {}, b"x")])
        j.commit(0)
        j.close()
    finally:
        os.umask(old)
    for name in FILES:
        assert stat.S_IMODE(os.stat(tmp_path / "j" / name).st_mode) == 0o600, name
    assert stat.S_IMODE(os.stat(tmp_path / "j").st_mode) == 0o700 & ~umask


def test_a_journal_made_readable_by_others_is_made_private_when_opened(built):
    for name in FILES:
        os.chmod(built.path / name, 0o644)  # as zq made them before, with the usual umask
    LmdbJournal(str(built.path)).close()
    for name in FILES:
        assert stat.S_IMODE(os.stat(built.path / name).st_mode) == 0o600, name


def test_a_secret_key_open_to_others_is_warned_about(tmp_path, caplog):
    from zq.keys import keygen
    from zq.server.security import warn_if_exposed

    _, secret = keygen(str(tmp_path), "server")
    with caplog.at_level(logging.WARNING, logger="zq.security"):
        assert warn_if_exposed(secret) == ""
        os.chmod(secret, 0o644)
        warning = warn_if_exposed(secret)
    assert "open to its group and every user (mode 0644)" in warning and f"chmod 600 {secret}" in warning
    assert warning in caplog.text


def test_damage_below_every_recovery_point_is_served_around_and_retention_says_what_it_deleted(built, caplog):
    """A record no queue needs any more (acked) is not read at recovery: the dispatcher
    serves; retention, which reads it to delete it, deletes it and says so once."""
    flip_everywhere(built.file, marker(4), 3)  # bookmark 5: acked
    j = LmdbJournal(str(built.path))
    try:
        engine = recover(j, [])
        assert engine.queues["jobs"].depth == 590 and engine.min_recovery_point() > built.seqs[4]
        with caplog.at_level(logging.ERROR, logger="zq.journal"):
            assert j.trim(engine.min_recovery_point(), 1 << 62) >= 10
        assert f"retention deleted a damaged record no queue needed: journal {built.file}: the message record at " \
               f"bookmark {built.seqs[4]} is damaged" in caplog.text
    finally:
        j.close()
    assert verify(str(built.path))["ok"]


def test_a_damaged_page_stops_retention_with_a_sentence_not_an_lmdb_error(built):
    root, _ = msgs_root(built.file)
    flip(built.file, root * PAGE + 20)
    j = LmdbJournal(str(built.path))
    try:
        with pytest.raises(JournalDamaged, match=f"journal {built.file} is damaged"):
            j.trim(built.next_seq, 1 << 62)
    finally:
        j.close()


def test_a_damaged_mark_is_refused_and_written_again_on_purpose(built):
    (built.path / I.ID_FILE).write_bytes(b"\x00garbage")
    with pytest.raises(JournalDamaged, match=r"journal.id \(this directory's journal identity\) is damaged; .*"
                                             r"`zq journal reset --keep"):
        LmdbJournal(str(built.path))
    reset(str(built.path), keep=True)
    assert I.read_mark(str(built.path)).next == built.next_seq
    assert verify(str(built.path))["ok"]


@pytest.mark.parametrize("how", ["type", "zero"])
def test_a_damaged_leaf_page_is_refused_not_an_lmdb_abort(built, tmp_path, how):
    """LMDB aborts the process (SIGABRT, an assertion in mdb_cursor_next) when a cursor
    steps onto a leaf whose type byte is wrong or that is zeros: the pages are checked by
    plain reads first (zq.journal.pages). (Before that check this test killed pytest.)"""
    damage_pages(built.file, leaf_pages_of(built.file, 300), how)
    msg = refused(built.path)
    assert msg.startswith(f"journal {built.file} is damaged: the message records between bookmarks "), msg
    assert "cannot be read (a damaged LMDB page: page " in msg
    report = verify(str(built.path))
    assert not report["ok"] and report["damaged"]["unreadable"][0]["last"] >= built.seqs[300]
    counts = export(str(built.path), str(tmp_path / "out"))
    assert 550 < counts["messages"] < 600
    fixed = repair(str(built.path))
    assert fixed["kept"]["messages"] == counts["messages"] and verify(str(built.path))["ok"]


def test_a_truncated_journal_is_repaired_from_what_is_there(built):
    full = os.path.getsize(built.file)
    truncate(built.file, full // 2)
    assert "save what it holds with `zq journal repair" in refused(built.path)
    fixed = repair(str(built.path))
    assert 100 < fixed["kept"]["messages"] < 600
    assert f"the journal was truncated: {full // 2} of {full} bytes" in fixed["problems"]
    assert os.path.getsize(os.path.join(fixed["damaged_file"], "data.mdb")) == full // 2  # kept as it was found
    assert verify(str(built.path))["ok"]
    recovered(built.path)
    j = LmdbJournal(str(built.path), readonly=True)
    assert j.next_seq() >= built.next_seq  # the mark: never numbering below what was given out
    j.close()


@pytest.mark.parametrize("at", [-7, -6, -5, -2, -1])  # a leaf node's header: its data size, its key size
def test_a_damaged_node_header_is_named_where_lmdb_refuses_it(built, tmp_path, at):
    """The page check reads page headers at a start (not every node: that would cost a
    record's read again); a node LMDB itself refuses (MDB_CORRUPTED) is stepped over by
    probing for the next key LMDB can reach."""
    seq = built.seqs[300]
    flip_everywhere(built.file, message_key(seq), at)
    msg = refused(built.path)
    assert msg.startswith(f"journal {built.file} is damaged: "), msg
    assert "cannot be read" in msg or f"bookmarks {seq} " in msg or "bytes (a damaged key)" in msg, msg
    report = verify(str(built.path))
    assert not report["ok"] and report["damaged"]
    fixed = repair(str(built.path))
    assert 550 < fixed["kept"]["messages"] < 600 and verify(str(built.path))["ok"]


def test_random_flips_end_in_a_sentence_or_a_recovery(built, tmp_path):
    """Seeded random damage anywhere in the file (1 to 5 bytes): recovery and verify end
    in a JournalError sentence or succeed; nothing else escapes (and nothing aborts)."""
    import random

    rng = random.Random(31)
    size = os.path.getsize(built.file)
    for trial in range(25):
        d = tmp_path / f"t{trial}"
        shutil.copytree(built.path, d)
        for _ in range(rng.choice([1, 2, 5])):
            flip(d / "data.mdb", rng.randrange(size), rng.randrange(1, 256))
        try:
            recovered(d)
        except JournalError as exc:
            assert str(exc).startswith(f"journal {d / 'data.mdb'}"), exc
        try:
            verify(str(d))
        except JournalError as exc:
            assert str(d / "data.mdb") in str(exc), exc
        shutil.rmtree(d)
