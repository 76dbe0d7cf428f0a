"""A damaged journal under the real commands: `zq serve` refuses it in one line naming
the damage (never a SIGBUS, -7; never a traceback; never an empty journal started in
silence), `zq journal verify` names it and exits 1, and the ways out the refusal names
(`zq journal repair`, `zq journal reset`) lead to a dispatcher that serves.

The journals are real files damaged on disk (tests/journal/damage_files.py); the
library side of each case is tests/journal/test_damage.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import zq as zq_client
from tests.journal.damage_files import (PAGE, build, current_meta, damage_pages, flip, flip_everywhere, leaf_pages_of,
                                        marker, message_key, meta, msgs_root, truncate)

from .support import ROOT, ServerProcess, env

SIGBUS = -signal.SIGBUS


def zq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zq.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**env(), "ZQ_PURE": "1"}, cwd=ROOT)


def serve(data) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    """`zq serve` on ``data``: it must refuse at once. One that serves instead is stopped
    (after a bounded wait for its 'serving' line) and the test fails."""
    proc = subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--data", str(data), "--bind", "tcp://127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env(), "ZQ_PURE": "1"},
                            cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        pytest.fail(f"zq serve served a damaged journal instead of refusing it: {err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def refusal(done: subprocess.CompletedProcess) -> str:
    """The one line a refusal is: exit 1, no SIGBUS, no traceback, nothing else."""
    assert done.returncode != SIGBUS, "SIGBUS"
    assert done.returncode >= 0, f"killed by signal {-done.returncode}: {done.stderr}"  # SIGABRT: LMDB's assertions
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def built(tmp_path):
    return build(tmp_path / "journal")


def damage(built, how: str) -> str:  # type: ignore[no-untyped-def]
    """Damage the journal ``how``; returns what the refusal must say."""
    f = built.file
    if how == "truncated to 0":
        truncate(f, 0)
        return f"journal {f} is empty (0 bytes) but this directory held a journal up to bookmark {built.next_seq - 1}"
    if how == "deleted":
        os.remove(f)
        return f"journal {f} is missing but this directory held a journal up to bookmark {built.next_seq - 1}"
    if how == "truncated to half":
        truncate(f, os.path.getsize(f) // 2)
        return f"journal {f} is truncated (or its meta page is damaged)"
    if how == "truncated to a page boundary":
        truncate(f, 5 * PAGE)
        return f"journal {f} is truncated (or its meta page is damaged): {5 * PAGE} bytes"
    if how == "truncated inside a meta page":
        truncate(f, PAGE + 100)
        return f"journal {f} is truncated: {PAGE + 100} bytes, shorter than LMDB's two meta pages"
    if how == "a payload byte flipped":
        flip_everywhere(f, marker(42), 4)
        return f"journal {f} is damaged: message records damaged at bookmarks {built.seqs[42]} "
    if how == "a key byte flipped":
        flip_everywhere(f, message_key(built.seqs[200]), 7, 0x01)
        return f"the message record of bookmark {built.seqs[200]} is stored under key {built.seqs[200] ^ 1}"
    if how == "a branch page damaged":
        root, _ = msgs_root(f)
        flip(f, root * PAGE + 20)
        return f"journal {f} is damaged: the message records between bookmarks "
    if how in ("a leaf page's type damaged", "a leaf page zeroed"):  # LMDB itself would abort (SIGABRT)
        damage_pages(f, leaf_pages_of(f, 300), "zero" if "zeroed" in how else "type")
        return f"journal {f} is damaged: the message records between bookmarks "
    if how == "a meta page's magic flipped":
        flip(f, PAGE + 16)
        return f"journal {f} is damaged (or not an LMDB file): meta page 1 is not an LMDB meta page"
    if how == "a meta page's root flipped":
        flip(f, current_meta(f)["offset"] + 128)
        return f"journal {f} is damaged: its meta page names root page"
    if how == "the older meta page made current":
        from zq.core import records as R
        from zq.journal.lmdb_journal import LmdbJournal

        j = LmdbJournal(str(built.path))  # a last commit with a message in it
        j.append([R.Message(built.next_seq, 0, "jobs", {}, b"the last commit")])
        j.commit(0)
        j.close()
        built.next_seq += 1
        older = min((meta(f, 0), meta(f, 1)), key=lambda m: m["txnid"])
        flip(f, older["offset"] + 151, 0x01)
        return f"this directory held it up to bookmark {built.next_seq - 1}: records are missing"
    raise AssertionError(how)


CASES = ["truncated to 0", "deleted", "truncated to half", "truncated to a page boundary",
         "truncated inside a meta page", "a payload byte flipped", "a key byte flipped", "a branch page damaged",
         "a leaf page's type damaged", "a leaf page zeroed", "a meta page's magic flipped", "a meta page's root flipped", "the older meta page made current"]


@pytest.mark.parametrize("how", CASES)
def test_zq_serve_refuses_a_damaged_journal_in_one_line_naming_the_damage(built, how):
    expected = damage(built, how)
    line = refusal(serve(built.path))
    assert line.startswith("zq: ") and expected in line, line
    assert ("zq journal reset" in line or "zq journal repair" in line), line  # and says the way out
    if how in ("truncated to 0", "deleted"):
        assert not built.file.exists() or os.path.getsize(built.file) == 0  # nothing started in its place


@pytest.mark.parametrize("how", CASES)
def test_zq_journal_verify_names_the_damage_and_exits_1(built, how):
    expected = damage(built, how)
    done = zq("journal", "verify", "--data", str(built.path))
    assert done.returncode >= 0 and "Traceback" not in done.stderr, done.stderr  # no SIGBUS, no SIGABRT
    assert done.returncode == 1, done
    if done.stdout:  # a journal it could read: the report names the damage
        report = json.loads(done.stdout)
        assert not report["ok"] and (report.get("damaged") or "records are missing" in report["problems"][0])
    line = done.stderr.strip().splitlines()[-1]
    assert expected.split(": ", 1)[-1][:40] in line or expected in done.stdout, (expected, done.stdout, line)


def test_repair_then_serve_keeps_every_sound_record_and_numbers_on(built, tmp_path):
    damage(built, "a payload byte flipped")
    done = zq("journal", "repair", str(built.path))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["kept"]["messages"] == 599 and report["damaged"] == {"messages": str(built.seqs[42])}
    assert zq("journal", "verify", "--data", str(built.path)).returncode == 0
    server = ServerProcess(tmp_path).start()  # serves tmp_path/journal, the repaired one
    try:
        with zq_client.connect(server.endpoint) as c:
            assert c.publish("jobs", b"after") >= built.next_seq  # never an old bookmark again
            assert c.stats()["queues"]["jobs"]["depth"] == 600 - 1 - 10 + 1
    finally:
        err = server.terminate()
    assert "Traceback" not in err


def test_repair_saves_what_a_truncated_journal_holds(built, tmp_path):
    damage(built, "truncated to half")
    done = zq("journal", "repair", str(built.path))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert 100 < report["kept"]["messages"] < 600 and any("truncated" in p for p in report["problems"])
    assert zq("journal", "verify", "--data", str(built.path)).returncode == 0
    server = ServerProcess(tmp_path).start()
    try:
        with zq_client.connect(server.endpoint) as c:
            assert c.publish("jobs", b"after") >= built.next_seq
    finally:
        assert "Traceback" not in server.terminate()


def test_export_saves_what_can_be_read_and_names_the_rest(built, tmp_path):
    damage(built, "a branch page damaged")
    done = zq("journal", "export", str(tmp_path / "out"), "--data", str(built.path))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    counts = json.loads(done.stdout)
    assert 500 < counts["messages"] < 600 and counts["damaged"]["unreadable"]
    assert "cannot be read" in done.stderr and "everything else is exported" in done.stderr
    assert len((tmp_path / "out" / "messages.jsonl").read_text().splitlines()) == counts["messages"]


def test_reset_then_serve_starts_anew_on_purpose(built, tmp_path):
    damage(built, "truncated to 0")
    done = zq("journal", "reset", str(built.path))
    assert done.returncode == 0, done.stderr
    assert "data.mdb" in os.listdir(json.loads(done.stdout)["moved_aside"])
    server = ServerProcess(tmp_path).start()
    try:
        with zq_client.connect(server.endpoint) as c:
            assert c.publish("jobs", b"first") == 1
    finally:
        server.terminate()


def test_a_server_running_on_the_directory_keeps_repair_and_reset_away(tmp_path):
    server = ServerProcess(tmp_path).start()
    try:
        for args in (("repair",), ("reset",)):
            done = zq("journal", *args, str(tmp_path / "journal"))
            assert done.returncode == 1 and "is in use by pid" in done.stderr, done
    finally:
        server.terminate()
    assert zq("journal", "verify", "--data", str(tmp_path / "journal")).returncode == 0


def test_the_ways_out_are_in_the_help():
    out = zq("journal", "--help").stdout
    assert "repair" in out and "reset" in out
    assert "--keep" in zq("journal", "reset", "--help").stdout
    assert "zq journal reset" in zq("serve", "--help").stdout.replace("\n  ", " ")


def test_zq_serve_warns_about_a_secret_key_others_can_read(tmp_path):
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    allowed.mkdir()
    assert zq("keygen", "server", "--dir", str(keys)).returncode == 0
    secret = keys / "server.key_secret"
    os.chmod(secret, 0o644)
    (tmp_path / "zq.toml").write_text('[security]\nsecret_key = "keys/server.key_secret"\nallow = "allowed"\n')
    proc = subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--config", str(tmp_path / "zq.toml"), "--data",
                             str(tmp_path / "journal"), "--bind", "tcp://127.0.0.1:0"],
                            stderr=subprocess.PIPE, text=True, env={**env(), "ZQ_PURE": "1"}, cwd=ROOT)
    seen = []
    deadline = time.monotonic() + 30
    try:
        for line in proc.stderr:  # type: ignore[union-attr]
            seen.append(line)
            if "zq serving on" in line or time.monotonic() > deadline:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    text = "".join(seen)
    assert f"security.secret_key {secret.resolve()} is open to its group and every user (mode 0644)" in text, text
    assert "chmod 600" in text
