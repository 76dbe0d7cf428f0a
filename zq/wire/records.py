"""The RECORDS answer's body: stored records as one msgpack array in one binary field,
with each record's size (docs/protocol.md, RANGE). The dispatcher builds it from the
records' own bytes (``records_frame``: one copy); clients and Spark executors decode
it (``decode_messages``, or ``zq.spark.columnar`` column by column)."""

from __future__ import annotations

import struct
import sys
from array import array

import msgspec

from zq.core import records as R


def msgpack_array(raws: list[bytes]) -> bytes:
    """Stored records as one msgpack array (header + the records' bytes)."""
    return b"".join([_array_head(len(raws)), *raws])


def _array_head(n: int) -> bytes:
    return bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n) if n < 65536 else b"\xdd" + struct.pack(">I", n)


def array_header_size(n: int) -> int:
    """Bytes of the msgpack array header ``msgpack_array`` puts before ``n`` records."""
    return 1 if n < 16 else 3 if n < 65536 else 5


def record_sizes(raws: list[bytes]) -> bytes:
    """Each record's size as a little-endian uint32."""
    sizes = array("I", map(len, raws))
    if sys.byteorder == "big":
        sizes.byteswap()
    return sizes.tobytes()


def records_frame(req: int, kind: str, raws: list[bytes], nxt: int, done: bool) -> bytes:
    """``wire.encode(wire.Records(req, kind, msgpack_array(raws), nxt, done, sizes))``
    with the records copied once, not twice: the frame is joined from the encoded
    fields around the records' own bytes. (Tested against ``wire.encode``.)"""
    head = _array_head(len(raws))
    n = len(head) + sum(map(len, raws))
    bin_head = b"\xc4" + n.to_bytes(1, "big") if n < 256 else b"\xc5" + n.to_bytes(2, "big") if n < 65536 \
        else b"\xc6" + n.to_bytes(4, "big")
    front = msgspec.msgpack.encode(("records", req, kind))  # a 3-array: one header byte, dropped
    back = msgspec.msgpack.encode((nxt, done, record_sizes(raws)))
    return b"".join([b"\x97", front[1:], bin_head, head, *raws, back[1:]])


def decode_messages(blob: bytes | memoryview) -> list[R.Message]:
    return _MESSAGES.decode(blob)


def decode_events(blob: bytes | memoryview) -> list[R.Event]:
    return _EVENTS.decode(blob)


_MESSAGES = msgspec.msgpack.Decoder(list[R.Message])
_EVENTS = msgspec.msgpack.Decoder(list[R.Event])
