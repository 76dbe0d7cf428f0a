"""Range reads for analytics (zq.ranges) on a real LMDB journal in a temp dir."""

from __future__ import annotations

import msgspec
import pytest

from zq import wire
from zq.core import records as R
from zq.journal.lmdb_journal import LmdbJournal
from zq.journal.ranges import RANGE_BYTES_MAX, record_seq, select_records
from zq.wire.records import decode_messages, msgpack_array, record_sizes, records_frame


def journal_with(tmp_path, records) -> LmdbJournal:
    j = LmdbJournal(str(tmp_path))
    j.append(records)
    j.commit()
    return j


def test_a_range_stops_before_its_end_bookmark_and_says_where_to_go_on(tmp_path):
    # Messages on every third bookmark (events would sit between): the msgs table has gaps.
    j = journal_with(tmp_path, [R.Message(s, 1, "t", {}, b"p%d" % s) for s in range(0, 3000, 3)])
    raws, nxt, done = select_records(j, "messages", 10, 100)
    assert [m.seq for m in decode_messages(msgpack_array(raws))] == list(range(12, 100, 3))
    assert (nxt, done) == (100, True)  # exhausted up to the end asked for
    raws, nxt, done = select_records(j, "messages", 10, None, limit=5)
    assert [record_seq(r) for r in raws] == [12, 15, 18, 21, 24] and (nxt, done) == (25, False)
    raws, nxt, done = select_records(j, "messages", 2990, None)
    assert [record_seq(r) for r in raws] == [2991, 2994, 2997] and (nxt, done) == (2998, True)
    assert select_records(j, "messages", 5000, None) == ([], 5000, True)
    assert select_records(j, "messages", 10, 12) == ([], 12, True)


def test_sizes_locate_every_record_of_the_blob(tmp_path):
    j = journal_with(tmp_path, [R.Message(s, 1, "t", {"k": "v" * s}, b"x" * s) for s in range(1, 40)])
    raws, _, _ = select_records(j, "messages", 0, None)
    blob, sizes = msgpack_array(raws), record_sizes(raws)
    lengths = [int.from_bytes(sizes[i : i + 4], "little") for i in range(0, len(sizes), 4)]
    assert lengths == [len(r) for r in raws] and len(lengths) == 39
    pos = 3  # the array header of 39 records (array16)
    for raw, n in zip(raws, lengths):
        assert blob[pos : pos + n] == raw
        pos += n
    assert pos == len(blob)


def test_an_answer_stops_near_its_byte_limit_but_always_carries_one_record(tmp_path):
    big = RANGE_BYTES_MAX // 3
    j = journal_with(tmp_path, [R.Message(s, 1, "t", {}, b"x" * big) for s in range(5)]
                     + [R.Message(5, 1, "t", {}, b"y" * (RANGE_BYTES_MAX + 10))])
    raws, nxt, done = select_records(j, "messages", 0, None)
    assert [record_seq(r) for r in raws] == [0, 1] and (nxt, done) == (2, False)
    raws, nxt, done = select_records(j, "messages", 5, None)
    assert [record_seq(r) for r in raws] == [5] and (nxt, done) == (6, False)


def test_topic_filters_match_exact_topics_and_regexes(tmp_path):
    j = journal_with(tmp_path, [R.Message(s, 1, ("a", "ab", "b")[s % 3], {}, b"") for s in range(30)])
    raws, _, _ = select_records(j, "messages", 0, None, match="ab")
    assert [record_seq(r) for r in raws] == list(range(1, 30, 3))
    raws, _, _ = select_records(j, "messages", 0, None, match=lambda t: t.startswith("a"))
    assert len(raws) == 20


@pytest.mark.parametrize("count, payload", [(0, 0), (1, 3), (15, 10), (16, 10), (300, 100), (5, 70_000)])
def test_records_frame_is_exactly_the_encoded_records_message(count, payload):
    raws = [R.record_encoder.encode(R.Message(s, 7, "t", {}, b"x" * payload)) for s in range(count)]
    for req, nxt, done in ((1, 0, True), (2**40, 2**33, False)):
        frame = records_frame(req, "messages", raws, nxt, done)
        expected = wire.Records(req, "messages", msgpack_array(raws), nxt, done, record_sizes(raws))
        assert frame == wire.encode(expected)
        got = wire.server_decoder.decode(frame)
        assert (got.req, got.next, got.done, bytes(got.blob)) == (req, nxt, done, msgpack_array(raws))
        assert msgspec.msgpack.decode(got.blob, type=list[R.Message]) == [R.record_decoder.decode(r) for r in raws]
