"""The expression language: grammar, errors, NULL handling, safety, and the compiled
form held to the reference evaluator by a property test."""

import time
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zq.core import expr as E
from zq.core.expr import ExprError, compile_filter, compile_value

ORDER = msgspec.json.encode({"order": {"qty": 10, "price": 25.5, "sym": "ABCD", "tags": ["a", "b"]},
                             "region": "eu", "ok": True, "n": None})
HDR = {"region": "eu", "kind": "limit", "size": "42", "flag": "true", "x-trace": "t1"}


def matches(text: str, headers: dict | None = None, payload: bytes = ORDER, topic: str = "orders") -> bool:
    return compile_filter(text)(HDR if headers is None else headers, payload, topic)


@pytest.mark.parametrize("text, expected", [
    ("region = 'eu'", True),
    ("region == 'us'", False),
    ("region <> 'us'", True),
    ("size > 40", True),  # a header is read as a number against a number
    ("size = '42'", True),
    ("size + 1 = 43", True),
    ("flag = TRUE", True),
    ("flag", True),
    ("NOT flag", False),
    ("\"x-trace\" = 't1'", True),
    ("kind IN ('market', 'limit')", True),
    ("kind NOT IN ('market', 'limit')", False),
    ("kind LIKE 'li%'", True),
    ("kind LIKE 'l_mit'", True),
    ("kind LIKE 'imi'", False),
    ("kind MATCHES '^li'", True),
    ("kind ~ 'mi'", True),
    ("kind NOT LIKE 'x%'", True),
    ("size BETWEEN 40 AND 50", True),
    ("size NOT BETWEEN 40 AND 50", False),
    ("/order/qty * /order/price > 250", True),
    ("/order/qty * /order/price = 255", True),
    ("/order/sym = 'ABCD' AND /region = region", True),
    ("/order/tags/1 = 'b'", True),
    ("/order/tags/5 IS NULL", True),
    ("/order IS NULL", True),  # an object is not a comparable value
    ("/ok", True),
    ("/n IS NULL", True),
    ("/missing IS NULL AND missing IS NULL", True),
    ("missing IS NOT NULL", False),
    ("@topic = 'orders'", True),
    ("@topic LIKE 'ord%'", True),
    ("-/order/qty < 0", True),
    ("(/order/qty - 4) / 2 = 3", True),
    ("/order/qty % 3 = 1", True),
    ("1 = 1 OR missing = 1", True),
    ("size * 2 >= 84 AND NOT (region = 'us' OR kind = 'market')", True),
])
def test_expressions_evaluate_as_documented(text, expected):
    assert matches(text) is expected


@pytest.mark.parametrize("text", [
    "missing = 1", "NOT missing = 1", "missing != 1", "NOT (missing = 1 AND 1 = 1)",
    "kind > 5", "NOT kind > 5",  # 'limit' is not a number: NULL either way
    "size / 0 = 1", "NOT size / 0 = 1",
    "missing IN ('a')", "missing NOT IN ('a')", "NOT missing LIKE 'a'",
])
def test_null_is_neither_true_nor_false(text):
    assert matches(text) is False


def test_not_over_null_in_and_or_follows_three_valued_logic():
    # NULL AND FALSE is FALSE, so its negation is TRUE.
    assert matches("NOT (missing = 1 AND 1 = 2)") is True
    # NULL OR TRUE is TRUE, so its negation is FALSE.
    assert matches("NOT (missing = 1 OR 1 = 1)") is False


def test_msgpack_bodies_and_content_type():
    payload = msgspec.msgpack.encode({"order": {"qty": 3}})
    assert matches("/order/qty = 3", payload=payload)
    assert matches("/order/qty = 3", headers={"content-type": "application/msgpack"}, payload=payload)
    assert not matches("/order/qty = 3", payload=b"not json at all")
    assert not matches("/order/qty = 3", payload=b"")
    assert not matches("/order/qty = 3", payload=b"[1, 2]")


def test_a_body_that_does_not_fit_the_paths_gives_null_not_an_error():
    assert matches("/order IS NOT NULL", payload=b'{"order": 5}')
    assert matches("/order/qty IS NULL", payload=b'{"order": 5}')
    assert matches("/order/qty IS NULL", payload=b'{"order": {"qty": ')


@pytest.mark.parametrize("text, position, words", [
    ("region = ", 9, "expected a value"),
    ("(region = 'eu'", 14, "expected ')'"),
    ("region = 'eu' region", 14, "expected an operator"),
    ("region AND 5", 11, "needs a condition"),
    ("region + (kind = 'a')", 15, "needs a value"),
    ("size + 1", 5, "needs a condition"),
    ("kind ~ '(a)\\1'", 7, "linear time"),
    ("kind ~ '(?=a)b'", 7, "linear time"),
    ("kind = 1e999", 7, "must be finite"),
    ("kind ~ '('", 7, "bad regular expression"),
    ("kind IN (1, size)", 12, "literals only"),
    ("region # 1", 7, "unexpected character"),
    ("@nope = 1", 0, "unknown field"),
    ("", 0, "empty expression"),
    ("a BETWEEN 1 OR 2", 12, "AND in BETWEEN"),
])
def test_bad_expressions_name_the_position(text, position, words):
    with pytest.raises(ExprError) as err:
        compile_filter(text)
    assert err.value.position == position
    assert words in str(err.value)
    assert err.value.code == "bad-expression"


def test_limits_refuse_oversized_and_too_deep_expressions():
    with pytest.raises(ExprError, match="longer than"):
        compile_filter("a = 1 AND " * 500 + "a = 1")
    with pytest.raises(ExprError, match="nested deeper"):
        compile_filter("(" * 100 + "a = 1" + ")" * 100)
    with pytest.raises(ExprError, match="IN list longer"):
        compile_filter("a IN (" + ", ".join(["1"] * 1100) + ")")


def test_no_code_execution_through_strings_or_names():
    # Names are header lookups and strings are literals: nothing reaches Python.
    f = compile_filter("__import__ = 'os' OR \"__class__\" = '); import os; ('")
    assert f({"__import__": "os"}, b"") is True
    assert f({}, b"") is False
    assert "import os" not in f.source.replace("'); import os; ('", "")
    v = compile_value("__builtins__")
    assert v({}, b"") is None


def test_value_expressions_return_values_or_null():
    v = compile_value("/order/qty * /order/price")
    assert v({}, ORDER) == 255
    assert v({}, b"{}") is None
    assert compile_value("size")(HDR, b"") == "42"
    with pytest.raises(ExprError, match="expected a value"):
        compile_value("size > 1")


def test_compiled_form_reports_what_it_reads():
    f = compile_filter("region = 'eu' AND /order/qty > 1 AND @topic = 'x'")
    assert f.headers_used == {"region"}
    assert f.body_paths == [("order", "qty")]
    assert f.uses_topic and f.uses_body


# ------------------------------------------------------------------ property


FIELDS = ["a", "b", "/x", "/y/z", "/l/0"]
LITERALS = st.one_of(
    st.integers(-3, 3).map(str),
    st.sampled_from(["'1'", "'x'", "'true'", "TRUE", "FALSE", "NULL", "1.5", "'2'"]),
)


def values(depth: int = 2):
    base = st.one_of(st.sampled_from(FIELDS), LITERALS)
    if depth == 0:
        return base
    sub = values(depth - 1)
    return st.one_of(
        base,
        st.builds(lambda a, op, b: f"({a} {op} {b})", sub, st.sampled_from(["+", "-", "*", "/", "%"]), sub),
        sub.map(lambda a: f"-{a}" if not a.startswith("-") else a),
    )


def conditions(depth: int = 3):
    v = values(1)
    leaf = st.one_of(
        st.builds(lambda a, op, b: f"{a} {op} {b}", v, st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), v),
        st.builds(lambda a, n: f"{a} {n}IN (1, 'x', TRUE)", v, st.sampled_from(["", "NOT "])),
        st.builds(lambda a, n: f"{a} IS {n}NULL", v, st.sampled_from(["", "NOT "])),
        st.builds(lambda a, n: f"{a} {n}LIKE '%1%'", v, st.sampled_from(["", "NOT "])),
        st.sampled_from(["a", "/x", "TRUE", "FALSE", "NULL"]),
    )
    if depth == 0:
        return leaf
    sub = conditions(depth - 1)
    return st.one_of(
        leaf,
        st.builds(lambda a, op, b: f"({a} {op} {b})", sub, st.sampled_from(["AND", "OR"]), sub),
        sub.map(lambda a: f"NOT ({a})"),
    )


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["1", "x", "true", "2", "1.5"]))
HEADER_VALUES = st.sampled_from(["1", "x", "true", "false", "2", "-1", "1.5", ""])


@settings(max_examples=400, deadline=None)
@given(
    text=conditions(),
    headers=st.dictionaries(st.sampled_from(["a", "b"]), HEADER_VALUES),
    body=st.fixed_dictionaries({}, optional={
        "x": SCALARS, "y": st.one_of(SCALARS, st.fixed_dictionaries({}, optional={"z": SCALARS})),
        "l": st.one_of(SCALARS, st.lists(SCALARS, max_size=2)),
    }),
)
def test_compiled_filters_agree_with_the_reference_evaluator(text, headers, body):
    payload = msgspec.json.encode(body)
    compiled = compile_filter(text)
    tree = E.parse_condition(text)
    assert compiled(headers, payload) is (E.reference_eval(tree, headers, body) is True), compiled.source
    # msgpack bodies read the same
    assert compiled(headers, msgspec.msgpack.encode(body)) is compiled(headers, payload)


@pytest.mark.parametrize("text", [
    "h ~ '(a+)+$'",                    # nested repetition: exponential under backtracking
    "h ~ '.*a.*x'",                    # two stars, search: ~20 s on 4 KiB with Python's re
    "h LIKE '%a%a%a%a%a%a%a%a%a%a%b'",  # LIKE of many %: polynomial under backtracking
    "h ~ '(a|a)*x'",
])
def test_patterns_that_would_backtrack_match_in_linear_time(text):
    """Every LIKE / MATCHES runs on RE2: the worst header (4 KiB) is one pass, not a stall.
    The bound is generous (backtracking takes seconds to centuries on these inputs)."""
    f = compile_filter(text)
    started = time.perf_counter()
    for _ in range(10):
        assert f({"h": "a" * 4095 + "!"}, b"") is False
    assert time.perf_counter() - started < 1.0


def test_a_lone_surrogate_in_a_json_body_is_null_for_a_pattern_not_an_error():
    f = compile_filter("/s ~ 'a'")
    assert f({}, b'{"s": "\\udcff"}') is False
