"""Hostile message bodies and headers from a seed, and what a test needs to throw them
at a real dispatcher and account for every one (issue #31 §1).

Theory of operation
-------------------
zq reads a message's content wherever an expression names a body path or a header: a
queue's ``filter``, ``priority``, ``sort_key``, ``lvq_key`` and ``barrier``, its group and
tenant headers, and the filters and value expressions of SUB, CLAIM, REPLAY, PEEK,
QUERY, purge, move and ack-filter. The rule: evaluating a message can fail only for that
message. A filter that cannot read a message does not match it; anything else sets the
message aside as poison (dead-lettered with ``zq.reason = "poison"`` and ``zq.error``),
live, at recovery and on a standby's takeover alike; a PUBLISH is refused before it is
journaled or accepted, never both.

``BodyFuzz(seed).batch()`` makes the same cases from the same seed: JSON and msgpack
bodies (raw msgpack maps, and documents with ``content-type: application/msgpack``)
holding strings that are not UTF-8 (values and map keys) or lone surrogates, nesting
10..200,000 deep (arrays and maps), integers beyond 64 bits (``10**5000`` in JSON text),
NaN / infinities / -0.0, msgpack bin, ext and timestamps (valid and not), arrays where
a map is expected, booleans where numbers are, empty and truncated documents, length
headers promising gigabytes, duplicate keys, strings at the message size limit (and one
byte over), and hostile header values (``"9" * 5000``, ``'1e999'``, ``'-0'``, ``'NaN'``...).
Every body carries the paths the evaluators read (``/a``, ``/a/b``, ``/k``, ``/p``), with
the hostile value at one of them (or beside them, where only a skipping decoder meets
it). Well-formed control bodies are mixed in: they must flow as usual.

``RawPeer`` speaks ZQP/1 on a bare DEALER, so every PUBLISH gets its own verdict (the
wire's error code, which ``zq.Client`` folds into exception classes) and frames a
client would refuse to build (headers that are not UTF-8) can be sent.

``check_fates`` accounts for every confirmed message of a queue from the dispatcher's
own answers: still in the queue (``explain``), settled (its events, read with RANGE),
set aside as poison (its dead letter, read back with REPLAY, carries ``zq.reason`` =
``poison``, ``zq.error``, ``zq.queue`` and ``zq.bookmark``; ``explain`` says so), or
filtered out (a queue with a ``filter``: it never entered). Anything else is lost.
"""

from __future__ import annotations

import json
import random
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec
import zmq

from zq import wire
from zq.core import limits

PATHS = ("/a", "/a/b", "/k", "/p")  # what the evaluators of the tests read
TARGETS = ("a", "a/b", "k", "p", "z")  # where a hostile value goes ("z": beside the read paths)
DEPTHS = (10, 64, 100, 1000, 10_000, 100_000, 200_000, 200_000)  # 200,000 twice: the known breaker
CASE_HEADER = "x-case"  # the header a test adds to say which case a journaled message is
HEADER_VALUES = (
    "9" * 5000, "9" * 4096, "9" * 4000, "1e999", "-1e999", "-0", "-0.0", "NaN", "nan", "inf", "-inf", "Infinity",
    "18446744073709551616", "-18446744073709551617", "9223372036854775808", "1e308", "4.9e-324", "0x10", "1_000",
    " 7 ", "", "\x00", "é" * 2000, "true", "-1",
)
CONTENT_TYPES = ("application/msgpack", "application/x-msgpack; charset=binary", "msgpack", "application/json",
                 "APPLICATION/MSGPACK", "")


# ------------------------------------------------------------------ documents


@dataclass(frozen=True)
class BadStr:
    """A string whose bytes are given as they are (not necessarily UTF-8)."""

    raw: bytes


@dataclass(frozen=True)
class Raw:
    """Bytes written into the encoded document verbatim (a JSON number of 5,000 digits)."""

    json: bytes
    msgpack: bytes = b"\xc0"


@dataclass(frozen=True)
class Pairs:
    """A map written from its pairs: duplicate keys, keys that are not strings."""

    items: tuple


@dataclass(frozen=True)
class Bin:
    data: bytes


@dataclass(frozen=True)
class Ext:
    code: int
    data: bytes


@dataclass(frozen=True)
class F32:
    value: float


@dataclass(frozen=True)
class Deep:
    """``depth`` nested arrays or maps around ``leaf`` (written without recursion)."""

    depth: int
    kind: str = "array"  # or "map" (each level {"a": ...})
    leaf: Any = 1


def to_json(v: Any) -> bytes:
    """JSON text of ``v``; NaN and the infinities as JavaScript writes them (not JSON)."""
    if v is None:
        return b"null"
    if v is True:
        return b"true"
    if v is False:
        return b"false"
    if type(v) is int:
        return str(v).encode()
    if type(v) is float or type(v) is F32:
        f = v.value if isinstance(v, F32) else v
        if f != f:
            return b"NaN"
        if f in (float("inf"), float("-inf")):
            return b"Infinity" if f > 0 else b"-Infinity"
        return repr(f).encode()
    if type(v) is str:
        return json.dumps(v).encode()  # ASCII, with \\u escapes (lone surrogates stay escapes)
    if type(v) is BadStr:
        return b'"' + v.raw + b'"'
    if type(v) is Raw:
        return v.json
    if type(v) is Bin:
        return json.dumps(v.data.decode("latin-1")).encode()
    if type(v) is Ext:
        return b"null"
    if type(v) is Deep:
        if v.kind == "array":
            return b"[" * v.depth + to_json(v.leaf) + b"]" * v.depth
        return b'{"a":' * v.depth + to_json(v.leaf) + b"}" * v.depth
    if type(v) in (list, tuple):
        return b"[" + b",".join(to_json(x) for x in v) + b"]"
    if type(v) is dict:
        v = Pairs(tuple(v.items()))
    if type(v) is Pairs:
        return b"{" + b",".join(to_json(k if type(k) in (str, BadStr) else str(k)) + b":" + to_json(x)
                                for k, x in v.items) + b"}"
    raise TypeError(f"no JSON for {type(v).__name__}")


def _mp_len(n: int, fix: int | None, fix_max: int, b8: int | None, b16: int, b32: int) -> bytes:
    if fix is not None and n <= fix_max:
        return bytes([fix | n])
    if b8 is not None and n < 1 << 8:
        return bytes([b8, n])
    if n < 1 << 16:
        return bytes([b16]) + struct.pack(">H", n)
    return bytes([b32]) + struct.pack(">I", n)


def to_msgpack(v: Any) -> bytes:
    """msgpack of ``v``, including what a well-behaved encoder would not write."""
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if type(v) is int:
        if 0 <= v < 128:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack(">b", v)
        if 0 <= v < 1 << 64:
            for tag, fmt, top in ((0xCC, ">B", 1 << 8), (0xCD, ">H", 1 << 16), (0xCE, ">I", 1 << 32), (0xCF, ">Q", 1 << 64)):
                if v < top:
                    return bytes([tag]) + struct.pack(fmt, v)
        if -(1 << 63) <= v < 0:
            for tag, fmt, low in ((0xD0, ">b", -(1 << 7)), (0xD1, ">h", -(1 << 15)), (0xD2, ">i", -(1 << 31)),
                                  (0xD3, ">q", -(1 << 63))):
                if v >= low:
                    return bytes([tag]) + struct.pack(fmt, v)
        raise ValueError("msgpack holds integers -2**63..2**64-1")
    if type(v) is float:
        return b"\xcb" + struct.pack(">d", v)
    if type(v) is F32:
        return b"\xca" + struct.pack(">f", v.value)
    if type(v) in (str, BadStr):
        raw = v.encode("utf-8", "surrogatepass") if type(v) is str else v.raw
        return _mp_len(len(raw), 0xA0, 31, 0xD9, 0xDA, 0xDB) + raw
    if type(v) in (bytes, Bin):
        data = v if type(v) is bytes else v.data
        return _mp_len(len(data), None, 0, 0xC4, 0xC5, 0xC6) + data
    if type(v) is Ext:
        n, code = len(v.data), struct.pack(">b", v.code)
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
        if n in fixed:
            return bytes([fixed[n]]) + code + v.data
        return _mp_len(n, None, 0, 0xC7, 0xC8, 0xC9) + code + v.data
    if type(v) is Raw:
        return v.msgpack
    if type(v) is Deep:
        head = b"\x91" if v.kind == "array" else b"\x81\xa1a"
        return head * v.depth + to_msgpack(v.leaf)
    if type(v) in (list, tuple):
        return _mp_len(len(v), 0x90, 15, None, 0xDC, 0xDD) + b"".join(to_msgpack(x) for x in v)
    if type(v) is dict:
        v = Pairs(tuple(v.items()))
    if type(v) is Pairs:
        return _mp_len(len(v.items), 0x80, 15, None, 0xDE, 0xDF) + b"".join(to_msgpack(k) + to_msgpack(x)
                                                                           for k, x in v.items)
    raise TypeError(f"no msgpack for {type(v).__name__}")


def with_value_at(target: str, value: Any, rng: random.Random) -> dict:
    """A document with every read path present and ``value`` at ``target``."""
    b, k, p = rng.randint(0, 6), f"k{rng.randint(0, 9)}", rng.randint(0, 9)
    if target == "a":
        return {"a": value, "k": k, "p": p}
    if target == "a/b":
        return {"a": {"b": value}, "k": k, "p": p}
    if target == "k":
        return {"a": {"b": b}, "k": value, "p": p}
    if target == "p":
        return {"a": {"b": b}, "k": k, "p": value}
    return {"z": value, "a": {"b": b}, "k": k, "p": p}


# ---------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    label: str  # family:format:where, e.g. "bad-utf8-value:msgpack:/k"
    payload: bytes
    headers: Any  # dict[str, str], or Pairs (header names / values a client cannot build)
    normal: bool = False  # a well-formed control: every evaluator reads it
    must_refuse: bool = False  # over a documented limit (§12) or a reserved header: refused, never journaled

    def header_items(self) -> list[tuple[Any, Any]]:
        return list(self.headers.items) if type(self.headers) is Pairs else list(self.headers.items())


class BodyFuzz:
    """Cases from a seed: the same seed (and batch number) gives the same cases.

    ``max_message_bytes`` is the dispatcher's ``server.max_message_size`` (the bodies
    at the limit are built to it); ``reserve_headers`` is how many headers the caller
    adds to each case (``CASE_HEADER``), so the at-the-limit header counts stay exact."""

    def __init__(self, seed: int, max_message_bytes: int = limits.MESSAGE_BYTES_MAX, reserve_headers: int = 1) -> None:
        self.seed = seed
        self.max_message_bytes = max_message_bytes
        self.reserve = reserve_headers
        self.families: list[tuple[str, Callable[[random.Random], Case]]] = [
            ("bad-utf8-value", self.bad_utf8_value), ("bad-utf8-key", self.bad_utf8_key),
            ("lone-surrogate", self.lone_surrogate), ("deep", self.deep), ("huge-int", self.huge_int),
            ("float-special", self.float_special), ("odd-type", self.odd_type), ("timestamp", self.timestamp),
            ("empty", self.empty), ("truncated", self.truncated), ("length-bomb", self.length_bomb),
            ("duplicate-keys", self.duplicate_keys), ("numeric-string", self.numeric_string),
            ("long-string", self.long_string), ("hostile-headers", self.hostile_headers),
            ("header-limits", self.header_limits), ("content-type", self.content_type_mismatch),
        ]

    # The known breakers of issue #31, in every batch.
    def breakers(self, rng: random.Random) -> list[Case]:
        out = []
        for fmt in ("json", "msgpack"):
            for target in ("k", "p", "a/b"):
                out.append(self.bad_utf8_value(rng, fmt, target))
            out.append(self.bad_utf8_key(rng, fmt))
            out.append(self.deep(rng, fmt, "a", 200_000, "array"))
            out.append(self.deep(rng, fmt, "p", 200_000, "map"))
        return out

    def batch(self, number: int = 0, hostile: int = 30, normal: int = 10) -> list[Case]:
        """The known breakers, ``hostile`` more cases drawn over every family (each family
        at least once per batch when ``hostile`` allows), ``normal`` controls; shuffled."""
        rng = random.Random(f"{self.seed}/{number}")
        cases = self.breakers(rng)
        names = [name for name, _ in self.families]
        rng.shuffle(names)
        picks = names[:hostile] + [rng.choice(names) for _ in range(max(0, hostile - len(names)))]
        fns = dict(self.families)
        cases += [fns[name](rng) for name in picks]
        cases += [self.control(rng, i) for i in range(normal)]
        rng.shuffle(cases)
        return cases

    # ------------------------------------------------------------ helpers

    def encode(self, rng: random.Random, doc: Any, fmt: str | None = None) -> tuple[bytes, dict[str, str], str]:
        """The document as JSON or msgpack (a raw map, or with a msgpack content-type)."""
        fmt = fmt or rng.choice(("json", "msgpack"))
        if fmt == "json":
            return to_json(doc), {}, "json"
        headers = {"content-type": "application/msgpack"} if rng.random() < 0.5 else {}
        return to_msgpack(doc), headers, "msgpack"

    def case(self, family: str, fmt: str, where: str, payload: bytes, headers: Any, **kw: Any) -> Case:
        return Case(f"{family}:{fmt}:{where}", payload, headers, **kw)

    def control(self, rng: random.Random, i: int) -> Case:
        n = rng.randint(0, 10**6)
        doc = {"a": {"b": rng.randint(0, 6)}, "k": f"k{n}", "p": rng.randint(0, 9)}
        payload, headers, fmt = self.encode(rng, doc)
        headers = {**headers, "g": f"g{n}", "tenant": f"t{i % 3}", "priority": str(rng.randint(0, 9)),
                   "rank": str(rng.randint(0, 99))}
        return self.case("control", fmt, f"#{i}", payload, headers, normal=True)

    # ------------------------------------------------------------ families

    def bad_utf8_value(self, rng: random.Random, fmt: str | None = None, target: str | None = None) -> Case:
        target = target or rng.choice(TARGETS)
        raw = rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xa0\xa1", b"k\xe2\x82", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80",
                          b"ok" + bytes([rng.randint(0x80, 0xFF)])])
        payload, headers, fmt = self.encode(rng, with_value_at(target, BadStr(raw), rng), fmt)
        return self.case("bad-utf8-value", fmt, "/" + target, payload, headers)

    def bad_utf8_key(self, rng: random.Random, fmt: str | None = None) -> Case:
        bad = BadStr(rng.choice([b"\xff", b"\xc3\x28", b"p\xff", b"\xed\xb3\xbf"]))
        where = rng.choice(["top", "in-a", "only"])
        if where == "top":
            doc: Any = Pairs(((bad, 1), ("a", {"b": 1}), ("k", "k1"), ("p", 2)))
        elif where == "in-a":
            doc = Pairs((("a", Pairs(((bad, 1), ("b", 2)))), ("k", "k1"), ("p", 2)))
        else:
            doc = Pairs(((bad, Pairs(((bad, "v"),))),))
        payload, headers, fmt = self.encode(rng, doc, fmt)
        return self.case("bad-utf8-key", fmt, where, payload, headers)

    def lone_surrogate(self, rng: random.Random) -> Case:
        target = rng.choice(TARGETS)
        text = rng.choice(["\udcff", "x\ud800", "\udfff\ud800", "k\udc80"])
        payload, headers, fmt = self.encode(rng, with_value_at(target, text, rng))
        return self.case("lone-surrogate", fmt, "/" + target, payload, headers)

    def deep(self, rng: random.Random, fmt: str | None = None, target: str | None = None, depth: int | None = None,
             kind: str | None = None) -> Case:
        depth = depth or rng.choice(DEPTHS)
        kind = kind or rng.choice(("array", "map"))
        target = target or rng.choice(TARGETS + ("top",))
        nest = Deep(depth, kind, rng.choice([1, "x", None, {"b": 1}]))
        if target == "top":  # the whole body: an array (a msgpack content-type makes it read) or a map
            fmt = fmt or rng.choice(("json", "msgpack"))
            payload = to_json(nest) if fmt == "json" else to_msgpack(nest)
            headers = {"content-type": "application/msgpack"} if fmt == "msgpack" else {}
            return self.case(f"deep-{kind}-{depth}", fmt, "top", payload, headers)
        payload, headers, fmt = self.encode(rng, with_value_at(target, nest, rng), fmt)
        return self.case(f"deep-{kind}-{depth}", fmt, "/" + target, payload, headers)

    def huge_int(self, rng: random.Random) -> Case:
        target = rng.choice(TARGETS)
        if rng.random() < 0.6:
            digits = rng.choice(["18446744073709551616", "-18446744073709551616", "1" + "0" * 5000,
                                 "-1" + "0" * 5000, "9" * 4301, "1" + "0" * 400 + ".5", "1" + "0" * 309,
                                 "123456789012345678901234567890e-10"])
            payload = to_json(with_value_at(target, Raw(digits.encode()), rng))
            return self.case("huge-int", "json", f"/{target}={digits[:12]}..({len(digits)})", payload, {})
        value = rng.choice([2**64 - 1, 2**63, 2**63 - 1, -(2**63), -(2**63) + 1])
        payload, headers, fmt = self.encode(rng, with_value_at(target, value, rng), "msgpack")
        return self.case("huge-int", fmt, f"/{target}={value}", payload, headers)

    def float_special(self, rng: random.Random) -> Case:
        target = rng.choice(TARGETS)
        if rng.random() < 0.5:
            token = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"-0", b"-0.0", b"1e-400",
                                b"1.7976931348623157e308", b"nan", b"inf"])
            payload = to_json(with_value_at(target, Raw(token), rng))
            return self.case("float-special", "json", f"/{target}={token.decode()}", payload, {})
        value = rng.choice([float("nan"), float("inf"), float("-inf"), -0.0, 5e-324, F32(float("nan")), F32(float("inf"))])
        payload, headers, fmt = self.encode(rng, with_value_at(target, value, rng), "msgpack")
        return self.case("float-special", fmt, f"/{target}={value!r}", payload, headers)

    def odd_type(self, rng: random.Random) -> Case:
        target = rng.choice(TARGETS)
        value = rng.choice([Bin(b"\x00\xff" * rng.randint(0, 40)), Ext(5, b"\x00"), Ext(-128, b"x" * 3), Ext(127, b""),
                            [1, 2, {"b": 3}], True, False, None, {"x": 1}, [], {}, "", Pairs(((1, 2), (None, 3))),
                            Pairs(((Bin(b"b"), 1),)), {"b": [True]}])
        if rng.random() < 0.2:  # the body itself is not a map
            top = rng.choice([[{"a": {"b": 1}}], "just a string", 12, True, None, Bin(b"\x81\xa1p\x01")])
            fmt = rng.choice(("json", "msgpack"))
            payload = to_json(top) if fmt == "json" else to_msgpack(top)
            headers = {"content-type": "application/msgpack"} if fmt == "msgpack" else {}
            return self.case("odd-type", fmt, f"top={type(top).__name__}", payload, headers)
        payload, headers, fmt = self.encode(rng, with_value_at(target, value, rng))
        return self.case("odd-type", fmt, f"/{target}={type(value).__name__}", payload, headers)

    def timestamp(self, rng: random.Random) -> Case:
        target = rng.choice(TARGETS)
        value = rng.choice([
            Ext(-1, struct.pack(">I", 1)),  # 32-bit seconds
            Ext(-1, struct.pack(">Q", (999_999_999 << 34) | 5)),  # 64-bit: nanoseconds and seconds
            Ext(-1, struct.pack(">Q", (1_000_000_000 << 34) | 5)),  # nanoseconds out of range
            Ext(-1, struct.pack(">Iq", 0, 2**62)),  # 96-bit: past any calendar
            Ext(-1, struct.pack(">Iq", 0, -(2**62))),
            Ext(-1, b"\x00" * 3),  # no timestamp is 3 bytes long
        ])
        payload, headers, fmt = self.encode(rng, with_value_at(target, value, rng), "msgpack")
        return self.case("timestamp", fmt, f"/{target}:{len(value.data)}B", payload, headers)

    def empty(self, rng: random.Random) -> Case:
        payload, headers = rng.choice([(b"", {}), (b"", {"content-type": "application/msgpack"}), (b"{}", {}),
                                       (b"\x80", {}), (b"   ", {}), (b"\n\t{", {}), (b"\xc0", {"content-type": "msgpack"}),
                                       (b"\xef\xbb\xbf{\"p\": 1}", {})])
        return self.case("empty", "any", repr(payload[:8]), payload, headers)

    def truncated(self, rng: random.Random) -> Case:
        doc = {"a": {"b": 1, "c": [1, 2, "x" * 20]}, "k": "key" * 5, "p": 2**40, "z": {"w": [None, 1.5]}}
        payload, headers, fmt = self.encode(rng, doc)
        cut = rng.randint(1, len(payload) - 1)
        return self.case("truncated", fmt, f"at {cut}/{len(payload)}", payload[:cut], headers)

    def length_bomb(self, rng: random.Random) -> Case:
        """msgpack length fields promising gigabytes that are not there."""
        payload = rng.choice([b"\xdf\xff\xff\xff\xff", b"\x83\xa1k\xdb\xff\xff\xff\xff", b"\x81\xa1a\xdd\xff\xff\xff\xff",
                              b"\x81\xa1p\xc6\xff\xff\xff\xff", b"\x81\xa1p\xc9\xff\xff\xff\xff\x05",
                              b"\x81\xdb\xff\xff\xff\xff"])
        headers = {"content-type": "application/msgpack"} if rng.random() < 0.5 else {}
        return self.case("length-bomb", "msgpack", payload[:6].hex(), payload, headers)

    def duplicate_keys(self, rng: random.Random) -> Case:
        key = rng.choice(["a", "k", "p"])
        first, second = rng.sample([1, "x", [1], {"b": 1}, None, True, 2**63, BadStr(b"\xff")], 2)
        doc = Pairs(((key, first), ("a", {"b": 1}), ("k", "k1"), ("p", 1), (key, second)))
        payload, headers, fmt = self.encode(rng, doc)
        return self.case("duplicate-keys", fmt, f"/{key}", payload, headers)

    def numeric_string(self, rng: random.Random) -> Case:
        target = rng.choice(TARGETS)
        value = rng.choice(["1e999", "-1e999", "NaN", "-0", "9" * 5000, "9" * 4300, "-" + "9" * 4301, "0x10", " 3 ",
                            "1_0", "Infinity", "4.9e-325"])
        payload, headers, fmt = self.encode(rng, with_value_at(target, value, rng))
        return self.case("numeric-string", fmt, f"/{target}={value[:8]}..({len(value)})", payload, headers)

    def long_string(self, rng: random.Random) -> Case:
        """A body at the message size limit exactly, or one byte over it (refused: limit)."""
        over = rng.random() < 0.3
        target = rng.choice(("k", "p", "a/b", "z"))
        fmt = rng.choice(("json", "msgpack"))
        filler = rng.choice(["x", "9"])
        bad = rng.random() < 0.3
        size = self.max_message_bytes + (1 if over else 0)

        def build(n: int) -> bytes:
            text = BadStr(filler.encode() * n + b"\xff") if bad else filler * n
            doc = with_value_at(target, text, random.Random(0))
            return to_json(doc) if fmt == "json" else to_msgpack(doc)

        n = size - len(build(0))
        payload = build(n)
        n += size - len(payload)  # the length header may have grown
        payload = build(n)
        assert len(payload) == size, (len(payload), size)
        headers = {"content-type": "application/msgpack"} if fmt == "msgpack" and rng.random() < 0.5 else {}
        return self.case("long-string", fmt, f"/{target} {'over' if over else 'at'} {size}", payload, headers,
                         must_refuse=over)

    def hostile_headers(self, rng: random.Random) -> Case:
        doc = {"a": {"b": rng.randint(0, 6)}, "k": f"k{rng.randint(0, 9)}", "p": rng.randint(0, 9)}
        payload, headers, fmt = self.encode(rng, doc)
        names = rng.sample(["priority", "rank", "tenant", "g", "content-type"], rng.randint(1, 4))
        over = False
        for name in names:
            value = rng.choice(CONTENT_TYPES) if name == "content-type" else rng.choice(HEADER_VALUES)
            headers[name] = value
            over = over or len(value) > limits.HEADER_BYTES_MAX
        where = ",".join(f"{n}={headers[n][:8]!r}..({len(headers[n])})" for n in names)
        return self.case("hostile-headers", fmt, where, payload, headers, must_refuse=over)

    def header_limits(self, rng: random.Random) -> Case:
        doc = {"a": {"b": 1}, "k": "k1", "p": 1}
        payload, base, fmt = self.encode(rng, doc)
        kind = rng.choice(["at-count", "over-count", "at-size", "over-size", "reserved", "bad-utf8-value",
                           "bad-utf8-name", "empty-name"])
        refuse = kind in ("over-count", "over-size", "reserved", "bad-utf8-value", "bad-utf8-name")
        room = limits.HEADERS_MAX - self.reserve - len(base)
        headers: Any = dict(base)
        if kind in ("at-count", "over-count"):
            headers.update({f"h{i}": str(i) for i in range(room + (1 if kind == "over-count" else 0))})
        elif kind in ("at-size", "over-size"):
            headers[rng.choice(["priority", "rank", "tenant", "g"])] = "9" * (limits.HEADER_BYTES_MAX + (kind == "over-size"))
        elif kind == "reserved":
            headers["zq.reason"] = "poison"
        elif kind == "empty-name":
            headers[""] = "1"
        elif kind == "bad-utf8-value":  # not UTF-8 on the wire: the frame is malformed (protocol)
            headers = Pairs(tuple(base.items()) + (("tenant", BadStr(b"t\xff")),))
        else:
            headers = Pairs(tuple(base.items()) + ((BadStr(b"g\xff"), "1"),))
        return self.case("header-limits", fmt, kind, payload, headers, must_refuse=refuse)

    def content_type_mismatch(self, rng: random.Random) -> Case:
        doc = with_value_at(rng.choice(TARGETS), rng.choice([1, "x", BadStr(b"\xff"), Deep(1000)]), rng)
        if rng.random() < 0.5:
            payload, ct = to_json(doc), rng.choice(CONTENT_TYPES[:5])  # JSON said to be msgpack
        else:
            payload, ct = to_msgpack(doc), rng.choice(("application/json", "text/plain", ""))
        return self.case("content-type", "mismatch", repr(ct), payload, {"content-type": ct})


# ------------------------------------------------------------------- the wire


@dataclass
class Verdict:
    """One PUBLISH's answer: a CONFIRM (``bookmark``), an ERROR (``code``, ``message``),
    or nothing within the wait (``code`` None and ``bookmark`` None)."""

    case: Case
    topic: str
    tag: str  # the CASE_HEADER value
    bookmark: int | None = None
    code: str | None = None
    message: str = ""

    @property
    def answered(self) -> bool:
        return self.bookmark is not None or self.code is not None


class RawPeer:
    """ZQP/1 on a bare DEALER: HELLO, then pipelined requests answered by ``req``."""

    def __init__(self, endpoint: str, name: str = "bodyfuzz", timeout: float = 20.0) -> None:
        self.sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.connect(endpoint)
        self.req = 0
        self.undecodable: list[str] = []  # server frames that did not decode (a failure of their own)
        self.sock.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, name)))
        deadline = time.monotonic() + timeout
        while True:
            frame = self._recv(deadline)
            if frame is None:
                raise TimeoutError(f"no WELCOME from {endpoint} within {timeout}s")
            if isinstance(frame, wire.Welcome):
                self.welcome = frame
                return

    def _recv(self, deadline: float) -> Any:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(min(500, max(1, int(left * 1000)))):
                if time.monotonic() >= deadline:
                    return None
                self.sock.send(wire.HEARTBEAT_FRAME)
                continue
            raw = self.sock.recv()
            try:
                return wire.server_decoder.decode(raw)
            except msgspec.DecodeError as exc:
                self.undecodable.append(f"{exc}: {raw[:80]!r}")

    def next_req(self) -> int:
        self.req += 1
        return self.req

    def call_many(self, frames: dict[int, bytes], timeout: float) -> dict[int, Any]:
        """Send every frame, collect the CONFIRM / REPLY / ERROR of each ``req`` (those not
        answered within ``timeout`` are missing from the result)."""
        for frame in frames.values():
            self.sock.send(frame)
        out: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        last_hb = time.monotonic()
        while len(out) < len(frames):
            if time.monotonic() - last_hb > 0.5:
                self.sock.send(wire.HEARTBEAT_FRAME)
                last_hb = time.monotonic()
            got = self._recv(min(deadline, time.monotonic() + 0.5))
            if got is None:
                if time.monotonic() >= deadline:
                    break
                continue
            req = getattr(got, "req", None)
            if req in frames and isinstance(got, (wire.Confirm, wire.Reply, wire.Error)):
                out[req] = got
        return out

    def call_alone(self, frame: bytes, req: int, timeout: float) -> Any:
        """One frame that may not decode on the other side: its ERROR then names no
        request (req 0), so nothing else is in flight meanwhile."""
        self.sock.send(frame)
        deadline = time.monotonic() + timeout
        while True:
            got = self._recv(deadline)
            if got is None:
                return None
            if isinstance(got, (wire.Confirm, wire.Reply, wire.Error)) and got.req in (req, 0):
                return got

    def publish(self, items: list[tuple[Case, str, str]], timeout: float = 60.0) -> list[Verdict]:
        """Each (case, topic, tag) in a PUBLISH of its own, pipelined (those with headers
        that are not UTF-8 one at a time: see ``call_alone``); one verdict each. The tag
        goes in the ``CASE_HEADER`` header (last, after the case's own)."""
        frames: dict[int, bytes] = {}
        alone: dict[int, bytes] = {}
        verdicts: dict[int, Verdict] = {}
        for case, topic, tag in items:
            req = self.next_req()
            headers = Pairs(tuple(case.header_items()) + ((CASE_HEADER, tag),))
            frame = to_msgpack(["pub", req, topic, [[Bin(case.payload), headers, None]]])
            malformed = any(type(x) is BadStr for kv in case.header_items() for x in kv)
            (alone if malformed else frames)[req] = frame
            verdicts[req] = Verdict(case, topic, tag)
        answers = self.call_many(frames, timeout)
        for req, frame in alone.items():
            answers[req] = self.call_alone(frame, req, timeout)
        for req, answer in answers.items():
            if answer is None:
                continue
            v = verdicts[req]
            if isinstance(answer, wire.Confirm) and len(answer.bookmarks) == 1:
                v.bookmark = answer.bookmarks[0]
            elif isinstance(answer, wire.Error):
                v.code, v.message = answer.code, answer.message
            else:
                v.code, v.message = "unexpected-answer", repr(answer)[:200]
        return list(verdicts.values())

    def close(self) -> None:
        try:
            self.sock.send(wire.encode(wire.Bye()))
        finally:
            self.sock.close(0)


# ------------------------------------------------------------------ accounting


@dataclass
class Fates:
    """Where every confirmed message of every queue is (``check_fates``)."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # queue -> fate -> messages
    problems: list[str] = field(default_factory=list)

    def note(self, queue: str, fate: str) -> None:
        per = self.counts.setdefault(queue, {})
        per[fate] = per.get(fate, 0) + 1

    def line(self) -> str:
        return "; ".join(f"{q}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
                         for q, c in sorted(self.counts.items()))


TERMINAL = ("acked", "expired")


def read_events(client: Any, queue: str, timeout: float = 60.0) -> list[Any]:
    from zq.wire.records import decode_events

    out, start = [], 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = client.read_range("events", start=start, target=queue, timeout=30.0)
        out.extend(decode_events(rec.blob))
        if rec.done:
            return out
        start = rec.next
    raise TimeoutError(f"reading the events of {queue} took over {timeout}s")


def replay_all(client: Any, target: str, start: int = 0, timeout: float = 60.0) -> list[Any]:
    """Every journaled message of ``target`` (a topic or a ^regex) from ``start``, unfiltered."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    with client.replay(target, start=start, window=1000) as r:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"replay of {target!r} did not end within {timeout}s ({len(got)} messages)")
            try:
                msg = r.get(min(left, 5.0))
            except StopIteration:
                return got
            if msg is not None:
                got.append(msg)


def check_fates(client: Any, queues: dict[str, dict[str, Any]], confirmed: dict[str, dict[int, str]],
                when: str, explain_poison: int = 50, well_formed: set[int] | frozenset[int] = frozenset()) -> Fates:
    """Account for each confirmed message of each queue (see the module docstring).

    ``queues``: name -> {"filter": bool, "dead_letter": topic}; ``confirmed``: queue ->
    {bookmark: label}; ``well_formed``: bookmarks of controls, which every evaluator
    reads and every queue filter matches (never poison, never kept out). A problem names
    the queue, the bookmark, the case and what is wrong; ``when`` prefixes it ("live,
    batch 2" / "after restart 2")."""
    fates = Fates()
    for q, settings in queues.items():
        try:
            events = read_events(client, q)
        except Exception as exc:  # noqa: BLE001 -- reported as a problem of its own
            fates.problems.append(f"{when}: RANGE events of {q} failed: {type(exc).__name__}: {exc}")
            continue
        last: dict[int, Any] = {}
        poisoned: dict[int, list[str]] = {}
        for ev in events:
            for i, b in enumerate(ev.bookmarks):
                if ev.kind in TERMINAL or b not in last or last[b].kind not in TERMINAL:
                    last[b] = ev
                if ev.kind == "expired" and ev.reason == "poison":
                    errs = getattr(ev, "errors", [])
                    poisoned.setdefault(b, []).append(errs[i] if len(errs) == len(ev.bookmarks) else "")
        # Its dead letters, as stored: what each says about its original.
        letters: dict[int, list[dict[str, str]]] = {}
        dlq = settings.get("dead_letter")
        if dlq:
            try:
                for m in replay_all(client, dlq):
                    if m.headers.get("zq.queue") == q and m.headers.get("zq.bookmark", "").isdigit():
                        letters.setdefault(int(m.headers["zq.bookmark"]), []).append(m.headers)
            except Exception as exc:  # noqa: BLE001
                fates.problems.append(f"{when}: REPLAY of dead letters {dlq} failed: {type(exc).__name__}: {exc}")
        labels = confirmed.get(q, {})
        for b, copies in poisoned.items():  # set aside, from a confirmed publish or a copy (move)
            label = labels.get(b, "a copy")
            if b in well_formed:
                fates.problems.append(f"{when}: {q} bookmark {b} ({label}) is well-formed but was set aside as "
                                      f"poison: {copies}")
            if len(copies) > 1:
                fates.problems.append(f"{when}: {q} bookmark {b} ({label}) set aside as poison {len(copies)} times")
            poison_letters = [h for h in letters.get(b, []) if h.get("zq.reason") == "poison"]
            if dlq and len(poison_letters) != 1:
                fates.problems.append(f"{when}: {q} bookmark {b} ({label}) poisoned, but {len(poison_letters)} dead "
                                      f"letters with zq.reason=poison in {dlq} (want 1): "
                                      f"{[h.get('zq.reason') for h in letters.get(b, [])]}")
            for h in poison_letters:
                if not h.get("zq.error"):
                    fates.problems.append(f"{when}: {q} bookmark {b} ({label}): its poison dead letter has no zq.error")
        for b, label in sorted(labels.items()):
            ev = last.get(b)
            if ev is not None and ev.kind in TERMINAL:
                fates.note(q, ev.kind if ev.kind == "acked" else f"expired:{ev.reason}")
                if ev.kind == "expired" and ev.reason not in ("poison", "replaced", "barrier", "purged", "moved") and dlq:
                    if not any(h.get("zq.reason") == ev.reason for h in letters.get(b, [])):
                        fates.problems.append(f"{when}: {q} bookmark {b} ({label}) expired ({ev.reason}) "
                                              f"with no dead letter in {dlq}")
                continue
            try:
                doc = client.explain(q, b, history=5)
            except Exception as exc:  # noqa: BLE001
                fates.problems.append(f"{when}: explain {q} {b} ({label}) failed: {type(exc).__name__}: {exc}")
                continue
            state = doc.get("state")
            if state in ("waiting", "leased"):
                fates.note(q, state)
            elif ev is None and settings.get("filter") and not doc.get("history"):
                fates.note(q, "filtered-out")
                if b in well_formed:
                    fates.problems.append(f"{when}: {q} bookmark {b} ({label}) is well-formed and matches the "
                                          "queue's filter, but never entered the queue")
            else:
                fates.note(q, "LOST")
                fates.problems.append(f"{when}: {q} bookmark {b} ({label}) is lost: not in the queue (explain: "
                                      f"{state!r}, {doc.get('why')}), not settled, not dead-lettered"
                                      + ("" if settings.get("filter") or ev is not None
                                         else ", and the queue has no filter to have kept it out")
                                      + (f"; last event {ev.kind} {ev.reason!r}" if ev is not None else ""))
        for b in sorted(poisoned)[:explain_poison]:  # zq explain says why it left
            try:
                doc = client.explain(q, b)
            except Exception as exc:  # noqa: BLE001
                fates.problems.append(f"{when}: explain {q} {b} (poison) failed: {type(exc).__name__}: {exc}")
                continue
            if "poison" not in json.dumps({"state": doc.get("state"), "why": doc.get("why")}, default=str):
                fates.problems.append(f"{when}: explain {q} {b} does not say poison: state {doc.get('state')!r}, "
                                      f"why {doc.get('why')}")
    return fates
