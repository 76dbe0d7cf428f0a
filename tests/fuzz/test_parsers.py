"""Hypothesis over every parser a peer or a config file reaches: each input gives a
value or a clear error (the module's own error type), never another exception, and
within a time bound."""

from __future__ import annotations

import time

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zq import wire
from zq.server.config import Config
from zq.core import records as R
from zq.core.errors import ConfigError
from zq.core.expr import ExprError, ExprLimits, compile_filter, compile_value

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TAGS = ["hello", "pub", "sub", "unsub", "ack", "cancel", "expire", "extend", "hb", "bye", "stats", "peek",
        "queues", "claim", "replay", "admin", "range", "bounds", "query", "nope"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=20),
                    st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                                                  max_size=4),
                      max_leaves=12)


@FAST
@given(st.binary(max_size=200))
def test_the_wire_decoder_gives_a_command_or_a_decode_error_for_any_bytes(body):
    try:
        wire.client_decoder.decode(body)
    except (msgspec.DecodeError, ValueError):
        pass


@FAST
@given(st.sampled_from(TAGS), st.lists(values, max_size=9))
def test_the_wire_decoder_on_commands_of_any_shape(tag, fields):
    body = msgspec.msgpack.encode([tag, *fields])
    try:
        wire.client_decoder.decode(body)
    except (msgspec.DecodeError, ValueError):
        pass


@FAST
@given(st.binary(max_size=200))
def test_the_journal_record_decoders_give_a_record_or_a_decode_error(raw):
    for decoder in (R.message_decoder, R.event_decoder):
        try:
            decoder.decode(raw)
        except (msgspec.DecodeError, ValueError):
            pass


TOKENS = ["x", "y", "/a", "/a/b", "@topic", "'s'", "'%a%'", "1", "1e999", "-1", "2.5", "99999999999999999999",
          "=", "<>", "<", ">=", "+", "*", "/", "%", "AND", "OR", "NOT", "IN", "(", ")", ",", "LIKE", "~",
          "'(a+)+$'", "'(a)\\1'", "IS", "NULL", "TRUE", "BETWEEN", "MATCHES", "#", "\"h\""]


@FAST
@given(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=25), st.text(max_size=30))
def test_every_expression_compiles_or_is_refused_and_evaluates_without_raising(tokens, tail):
    text = " ".join(tokens) + (tail if len(tail) < 3 else "")
    for compile_ in (compile_filter, compile_value):
        started = time.perf_counter()
        try:
            fn = compile_(text)
        except ExprError:
            continue
        for headers, payload in (({"x": "a" * 4000, "y": "1"}, b'{"a": {"b": 2}}'), ({}, b"\xff"),
                                 ({"x": "1e999"}, b'{"a": "\\udcff"}')):
            fn(headers, payload, "topic")
        assert time.perf_counter() - started < 2.0, text


def deep(draw_leaf: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Well-formed expressions of every construct, nested far past the depth limit."""
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.builds("NOT ({})".format, inner), st.builds("-({})".format, inner),
            st.builds("({}) + {}".format, inner, draw_leaf), st.builds("{} * ({})".format, draw_leaf, inner),
            st.builds("({}) AND ({})".format, inner, inner), st.builds("({}) OR {}".format, inner, draw_leaf),
            st.builds("({}) < -{}".format, inner, draw_leaf), st.builds("({}) IS NOT NULL".format, inner),
            st.builds("({}) NOT IN (1, 'a')".format, inner), st.builds("({}) NOT LIKE 'a%'".format, inner),
        )
    return st.recursive(draw_leaf, extend, max_leaves=200)


@FAST
@given(deep(st.sampled_from(["x", "y", "/a/b", "@topic", "1", "'s'", "TRUE", "NULL"])))
def test_deeply_nested_expressions_compile_or_are_refused_never_crash(text):
    for compile_ in (compile_filter, compile_value):
        try:
            fn = compile_(text)
        except ExprError:
            continue
        fn({"x": "1", "y": "a"}, b'{"a": {"b": 2}}', "topic")


@pytest.mark.parametrize("op", ["AND", "OR"])
def test_a_long_chain_of_and_or_compiles_to_the_chains_value(op):
    # 250 terms (3,500 characters) made a left-deep tree that was
    # refused by Python's parser (too many nested parentheses) and answered as an
    # internal error.
    terms = [f"x = '{i}'" for i in range(250)]
    text = f" {op} ".join(terms)
    fn = compile_filter(text)
    assert fn({"x": "7"}, b"", "t") is (op == "OR")
    assert fn({"x": "nope"}, b"", "t") is False
    assert compile_filter(f" {op} ".join(["x = '1'"] * 250))({"x": "1"}, b"", "t") is True


def test_arithmetic_and_minus_chains_count_toward_the_depth_limit():
    with pytest.raises(ExprError, match="nested deeper than 64"):
        compile_value(" + ".join(["x"] * 66))
    with pytest.raises(ExprError, match="nested deeper than 64"):
        compile_value("-" * 65 + "x")
    assert compile_value(" + ".join(["1"] * 60))({}, b"", "t") == 60


def test_expression_limits_are_the_callers():
    small = ExprLimits(chars=20, depth=2, in_items=3)
    with pytest.raises(ExprError, match="longer than 20"):
        compile_filter("x = 'aaaaaaaaaaaaaaaaaaaaaa'", small)
    with pytest.raises(ExprError, match="nested deeper than 2"):
        compile_filter("((((x))))", small)
    with pytest.raises(ExprError, match="IN list longer than 3"):
        compile_filter("x IN (1,2,3,4)", small)
    big = ExprLimits(chars=65_536, in_items=65_536)
    assert compile_filter("x IN (" + ",".join(map(str, range(10_000))) + ")", big)({"x": "9999"}, b"", "t")
    for bad in (ExprLimits(chars=0), ExprLimits(depth=65), ExprLimits(in_items=1 << 40), ExprLimits(chars="9")):
        with pytest.raises(ConfigError):
            bad.check()


config_values = st.one_of(st.text(max_size=30), st.integers(-(2**70), 2**70), st.booleans(), st.none(),
                          st.floats(), st.lists(st.text(max_size=5), max_size=3))
QUEUE_KEYS = ["name", "topics", "semantics", "fairness", "lease", "max_per_subscription_backlog", "max_cancels",
              "max_deliveries", "expiration", "dead_letter", "group_header", "group_policy", "max_groups", "filter",
              "dedup_window", "leasing", "lvq_key", "barrier", "browse_only", "priority", "sort_key",
              "target_queue_depth", "max_depth", "max_bytes", "overflow", "resume_percent", "nope"]
SERVER_KEYS = ["data", "bind", "durability", "fsync_interval", "auto_queues", "heartbeat", "heartbeat_liveness",
               "retention", "max_message_size", "metrics"]


@FAST
@given(st.dictionaries(st.sampled_from(SERVER_KEYS), config_values, max_size=4),
       st.lists(st.dictionaries(st.sampled_from(QUEUE_KEYS), config_values, max_size=8), max_size=3),
       st.sampled_from(["queue", "server", "both"]))
def test_the_config_loader_gives_a_config_or_a_config_error(server, queues, which):
    raw: dict = {}
    if which in ("server", "both"):
        raw["server"] = server
    if which in ("queue", "both"):
        raw["queue"] = [{"name": "q", **q} if i == 0 else q for i, q in enumerate(queues)]
    try:
        Config.from_dict(raw)
    except ConfigError:
        pass
