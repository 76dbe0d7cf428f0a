"""The vectorised record parser (zq.columnar) against the record-by-record decoder.

No Spark session here: only pyarrow and numpy. Every case checks that the fast path
was really taken (``MessageColumns`` did not refuse the batch), then that its Arrow
batch equals the one built from msgspec-decoded records.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow", reason="zq.columnar needs pyarrow: pip install 'zq[spark]'")
pytest.importorskip("numpy", reason="zq.columnar needs numpy: pip install 'zq[spark]'")

from zq.spark.columnar import MessageColumns, Unparsed
from zq.core import records as R
from zq.wire.records import decode_messages, msgpack_array
from zq.spark import decoded_messages_batch, messages_batch


def answer(records: list) -> tuple[bytes, bytes]:
    raws = [R.record_encoder.encode(r) for r in records]
    sizes = b"".join(len(r).to_bytes(4, "little") for r in raws)
    return msgpack_array(raws), sizes


def check(records: list, group_header: str = "group") -> pa.RecordBatch:
    blob, sizes = answer(records)
    MessageColumns(blob, sizes)  # the fast path must accept every well-formed message record
    fast = messages_batch(blob, sizes, group_header)
    slow = decoded_messages_batch(decode_messages(blob), group_header)
    assert fast.schema == slow.schema
    for name in fast.schema.names:
        assert fast.column(name).to_pylist() == slow.column(name).to_pylist(), name
    assert fast.equals(slow)
    fast.validate(full=True)
    assert messages_batch(memoryview(blob), sizes, group_header).equals(fast)  # as the client receives it
    return fast


def msg(seq: int, **kw) -> R.Message:
    base = {"ts_ms": 1_795_345_369_460, "topic": "orders", "headers": {}, "payload": b"x" * 128}
    base.update(kw)
    return R.Message(seq, **base)


def test_every_integer_width_of_bookmarks_and_timestamps():
    seqs = [0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**62]
    check([msg(s, ts_ms=s) for s in seqs])


def test_strings_and_payloads_around_the_inline_limit_and_every_length_width():
    rows = []
    for i, n in enumerate([0, 1, 11, 12, 13, 31, 32, 255, 256, 65_535, 65_536]):
        rows.append(msg(i, topic="t" * max(n, 1), payload=bytes(range(256)) * (n // 256) + b"p" * (n % 256),
                        msg_id=None if n % 2 else "é" * n, headers={"k" * n: "v" * n} if n < 1000 else {}))
    check(rows)


def test_headers_group_priority_and_dead_letter_copies():
    rows = [
        msg(1, headers={"group": "g1", "priority": "7"}),
        msg(2, headers={"priority": " 12 "}),  # int() accepts the spaces: Arrow's cast does not
        msg(3, headers={"priority": "high", "group": "ünï"}),
        msg(4, headers={f"h{i}": str(i) for i in range(40)}),  # map16
        msg(5, copy_of=3, headers={"zq.reason": "expired"}),
        msg(6, copy_of=2**40, msg_id="id-6"),
        msg(7),
        msg(8, headers={"priority": ""}), msg(9, headers={"priority": "+3"}), msg(10, headers={"priority": "007"}),
        msg(11, headers={"priority": "1_000"}), msg(12, headers={"priority": "-0"}),
        msg(13, headers={"priority": str(2**63)}), msg(14, headers={"priority": str(-(2**63))}),  # int64's edges
    ]
    batch = check(rows)
    assert batch.column("priority").to_pylist() == [7, 12, None, None, None, None, None, None, 3, 7, 1000, 0,
                                                    None, -(2**63)]
    assert batch.column("group").to_pylist()[:3] == ["g1", None, "ünï"]
    check(rows, group_header="h3")


def test_a_short_string_at_the_very_end_of_the_answer():
    check([msg(1, msg_id="a")])  # its 12-byte read would run past the blob
    check([msg(1, topic="t", headers={}, payload=b"", msg_id="abc")])


def test_empty_and_single_and_sixteen_record_answers_use_each_array_header():
    check([])
    check([msg(1)])
    check([msg(i) for i in range(16)])
    check([msg(i) for i in range(70_000)][:65_536 + 1])


def test_records_not_in_the_message_layout_are_refused_and_decoded_the_slow_way():
    good = [msg(1, msg_id="x"), msg(2)]
    blob, sizes = answer(good)
    # An older, 7-field layout of the same struct: the fast path must not guess.
    old = [msgspec.msgpack.encode(["m", 1, 2, "t", {}, b"p", None]), msgspec.msgpack.encode(["m", 2, 3, "t", {}, b"q", "i"])]
    old_blob = msgpack_array(old)
    old_sizes = b"".join(len(r).to_bytes(4, "little") for r in old)
    with pytest.raises(Unparsed):
        MessageColumns(old_blob, old_sizes)
    with pytest.raises(Unparsed):  # sizes that do not match the records
        MessageColumns(blob, (int.from_bytes(sizes[:4], "little") + 1).to_bytes(4, "little") + sizes[4:])
    with pytest.raises(Unparsed):  # a record cut short
        MessageColumns(blob[:-3], sizes)
    # messages_batch still answers correctly, by decoding.
    decoded = messages_batch(blob[:1] + blob[1:], sizes)
    assert decoded.column("bookmark").to_pylist() == [1, 2]
    assert messages_batch(blob, b"").equals(decoded)  # an answer without sizes (an older dispatcher)


texts = st.text(max_size=40)
records = st.builds(
    R.Message,
    seq=st.integers(0, 2**63 - 1),
    ts_ms=st.integers(0, 2**44),  # to the year 2527: Arrow timestamps hold microseconds in an int64
    topic=st.text(min_size=1, max_size=40),
    headers=st.dictionaries(st.one_of(texts, st.sampled_from(["group", "priority"])),
                            st.one_of(texts, st.integers(-(2**62), 2**62).map(str)), max_size=5),
    payload=st.binary(max_size=300),
    msg_id=st.one_of(st.none(), texts),
    copy_of=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(records, max_size=40))
def test_any_batch_of_message_records_parses_exactly_as_decoded(rows):
    check(rows)


def test_a_copied_row_whose_id_is_a_transaction_s_derived_one_gets_its_own_stable_id():
    """``zq:`` ids are the dispatcher's (docs/protocol.md §7.9): a Spark copy of a
    transaction's outputs publishes them under ``spark:zq:...``, the same for a retried task."""
    from zq.spark.source import WriteOptions, message_of

    opts = WriteOptions({"endpoint": "tcp://127.0.0.1:1", "topic": "copy"}, False)
    row = {"payload": b"x", "headers": {}, "group": None, "priority": None}
    assert message_of(opts, row, "zq:orders:5:0")[2] == "spark:zq:orders:5:0"
    assert message_of(opts, row, "o-1")[2] == "o-1"
