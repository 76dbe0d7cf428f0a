"""zq journal info / verify / export on a real LMDB journal."""

import json

import lmdb
import pyarrow.parquet as pq

from zq.core.engine import Engine
from zq.journal.lmdb_journal import LmdbJournal, key
from zq.journal.tools import export, info, verify


def journal_with_traffic(path):  # type: ignore[no-untyped-def]
    j = LmdbJournal(str(path))
    e = Engine(content=j.get_message, find_id=j.find_id)
    for i in range(5):
        e.publish("jobs", json.dumps({"n": i}).encode(), {"k": str(i)}, 1000 + i, msg_id=f"id{i}")
    e.publish("jobs", b"\xff\xfe", {}, 2000)
    e.subscribe("w", "jobs", "w", 3, 2000)
    out = e.drain(2000)
    e.ack("w", out.deliveries[0].seqs, 2001)
    j.append(out.records)
    j.append(e.drain(2001).records)
    j.commit(2001)
    j.close()


def test_info_verify_and_export_jsonl_and_parquet(tmp_path):
    journal_with_traffic(tmp_path / "j")
    i = info(str(tmp_path / "j"))
    assert i["messages"] == 6 and i["event_records"] == 3 and i["declared_queues"] == ["jobs"]
    assert i["oldest_message"] == 1 and i["newest_message"] == 6 and i["format"] == 2
    report = verify(str(tmp_path / "j"))
    assert report["ok"] and report["queues"]["jobs"]["depth"] == 3
    heard: list[int] = []
    counts = export(str(tmp_path / "j"), str(tmp_path / "out"), progress=heard.append)
    assert counts == {"messages": 6, "event_rows": 9}  # 3 leased, 3 acked, 3 leased again: a row per bookmark
    # each count says what it counts, and they agree: info and verify count event records,
    # verify and export the rows they explode into
    assert report["checked"] == {"messages": 6, "event_records": 3, "event_rows": 9}
    assert heard == [6 + 3]  # the last word: every record read
    rows = [json.loads(x) for x in (tmp_path / "out" / "messages.jsonl").read_text().splitlines()]
    assert rows[-1]["encoding"] == "base64" and rows[0]["msg_id"] == "id0"
    export(str(tmp_path / "j"), str(tmp_path / "pq"), "parquet")
    table = pq.read_table(tmp_path / "pq" / "events.parquet")
    assert table.num_rows == 9 and set(table.column("kind").to_pylist()) == {"leased", "acked"}


def test_verify_reports_a_record_that_does_not_decode(tmp_path):
    journal_with_traffic(tmp_path / "j")
    env = lmdb.open(str(tmp_path / "j"), max_dbs=5)
    with env.begin(write=True, db=env.open_db(b"msgs")) as txn:
        txn.put(key(3), b"\xc1 not msgpack")
    env.close()
    report = verify(str(tmp_path / "j"))
    assert not report["ok"] and "message records damaged at bookmarks 3 " in report["problems"][0]
    assert report["damaged"] == {"messages": "3"}
