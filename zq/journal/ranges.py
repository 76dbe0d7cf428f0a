"""Range reads of stored records, in short read transactions: what a RANGE request
answers (the dispatcher's reader thread) and what a Spark executor reads from a journal
directory. Records stay as stored bytes: only a topic or queue filter looks inside."""

from __future__ import annotations

import struct
import zlib
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate, islice
from operator import itemgetter

import msgspec

from zq.core import records as R

RANGE_RECORDS_MAX = 65_536
RANGE_BYTES_MAX = 16 * 1024 * 1024
_RESIDUE = 0x2144DF1C  # zq.journal.integrity.RESIDUE: the CRC-32 of a sealed record
_UNSEAL = itemgetter(slice(None, -4))


_KEY = struct.Struct(">Q")


def select_records(
    journal,  # type: ignore[no-untyped-def]
    kind: str,
    start: int,
    end: int | None,
    match: Callable[[str], bool] | str | None = None,
    queue: str | None = None,
    limit: int = RANGE_RECORDS_MAX,
) -> tuple[list[bytes], int, bool]:
    """The stored records of ``kind`` in [start, end), at most ``limit`` of them and
    about ``RANGE_BYTES_MAX`` bytes; the next bookmark to read from; whether the range
    is exhausted. One short read transaction.

    The hot path runs in C: ``islice`` pulls the values from the cursor (keys are not
    even materialised: every record starts with its own bookmark), the end bookmark is
    found by bisecting, which decodes only the probed records' seqs, and the byte
    limit by accumulating lengths. Only a topic or queue filter looks at records one
    by one.

    Records are returned unsealed, as the wire carries them; their checksums are
    checked all at once (one ``zlib.crc32`` each, in C): a damaged one fails the read
    with ``JournalDamaged`` naming it.
    """
    db = journal.msgs if kind == "messages" else journal.events
    limit = max(1, min(limit, RANGE_RECORDS_MAX))
    with journal.env.begin(db=db) as txn, txn.cursor() as cur:
        raws = list(islice(cur.iternext(keys=False), limit)) if cur.set_range(_KEY.pack(max(start, 0))) else []
    exhausted = len(raws) < limit
    if end is not None and raws and record_seq(raws[-1]) >= end:
        raws = raws[: bisect_left(raws, end, key=record_seq)]
        exhausted = True
    if sum(map(len, raws)) > RANGE_BYTES_MAX:
        sizes = list(accumulate(map(len, raws)))
        raws = raws[: max(1, bisect_left(sizes, RANGE_BYTES_MAX))]
        exhausted = False
    if raws:
        raws = unseal_all(journal, raws, kind, start)
    nxt = record_seq(raws[-1]) + 1 if raws else start
    if isinstance(match, str):  # one exact topic: compare its encoded bytes in place
        enc, w = msgspec.msgpack.encode(match), _UINT_WIDTH
        raws = [v for v in raws if v.startswith(enc, 3 + (i := w[v[3]]) + w[v[3 + i]]) and v[1:3] == b"\xa1m"]
    elif match is not None:
        raws = [v for v in raws if match(record_topic(v))]
    elif queue:
        raws = [v for v in raws if R.event_decoder.decode(v).queue == queue]
    if exhausted and end is not None:
        nxt = max(nxt, end)
    return raws, nxt, exhausted


def unseal_all(journal, stored: list[bytes], kind: str, start: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    """Stored records (read from ``start`` on), their checksums checked, as the wire
    carries them."""
    sums_from = journal.sums_from
    if sums_from and record_seq(stored[0]) < sums_from:  # a journal upgraded from format 1: some are not sealed
        return [bytes(journal.open_record(record_seq(v), v)) if record_seq(v) >= sums_from else v for v in stored]
    if not all(map(_RESIDUE.__eq__, map(zlib.crc32, stored))):  # in C: no Python step per record
        damaged_in(journal, kind, start, len(stored))
    return list(map(_UNSEAL, stored))


def damaged_in(journal, kind: str, start: int, n: int) -> None:  # type: ignore[no-untyped-def]
    """Raise ``JournalDamaged`` naming the damaged records among the ``n`` from ``start``
    (read again with their keys: a damaged record's own bytes cannot say which it is)."""
    from zq.journal.integrity import JournalDamaged, ranges_text

    bad = []
    with journal.env.begin(db=journal.msgs if kind == "messages" else journal.events) as txn, txn.cursor() as cur:
        if cur.set_range(_KEY.pack(max(start, 0))):
            for k, v in islice(cur.iternext(), n):
                if zlib.crc32(v) != _RESIDUE:
                    bad.append(_KEY.unpack(k)[0])
    raise JournalDamaged(f"journal {journal.file}: the {kind[:-1]} records at bookmarks {ranges_text(bad)} are "
                         f"damaged (their checksums do not match); `zq journal verify --data {journal.path}` names "
                         "every damaged one", bad)


def record_seq(raw: bytes) -> int:
    """The bookmark of a stored record (message or event: ``[tag, seq, ...]``)."""
    w = _UINT_WIDTH[raw[3]]
    return raw[3] if w == 1 else int.from_bytes(raw[4 : 3 + w], "big")


# Width in bytes of a msgpack unsigned int by its first byte (fixint 1, uint8..64).
_UINT_WIDTH = [1] * 0x80 + [0] * 0x80
_UINT_WIDTH[0xCC], _UINT_WIDTH[0xCD], _UINT_WIDTH[0xCE], _UINT_WIDTH[0xCF] = 2, 3, 5, 9


def record_topic(raw: bytes) -> str:
    """The topic of a stored message record without decoding the rest of it.

    Layout (``records.Message``, array-like): array header, "m", seq, ts_ms, topic, ...
    """
    if raw[0] & 0xF0 != 0x90 or raw[1:3] != b"\xa1m":
        return R.message_decoder.decode(raw).topic  # not the compact layout: decode it all
    i = 3
    i += _UINT_WIDTH[raw[i]] or 0
    i += _UINT_WIDTH[raw[i]] or 0
    b = raw[i]
    if 0xA0 <= b <= 0xBF:
        n, i = b & 0x1F, i + 1
    elif b == 0xD9:
        n, i = raw[i + 1], i + 2
    elif b == 0xDA:
        n, i = int.from_bytes(raw[i + 1 : i + 3], "big"), i + 3
    else:
        return R.message_decoder.decode(raw).topic
    return raw[i : i + n].decode()


