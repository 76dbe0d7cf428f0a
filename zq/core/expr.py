"""The expression language of filters, queue filters, priorities and aggregates.

Theory of operation
-------------------
An expression is parsed once (``parse``) into a small tree, checked (boolean where a
condition is needed, a value where a value is), and compiled (``compile_filter``,
``compile_value``) into one Python function by *generating source from the tree*.
Nothing the user typed reaches that source except through ``repr`` of a literal
(strings, numbers) or of a field name, and the function runs with no builtins, so
an expression can only read fields and call the helpers below: no code execution.
Cost is bounded by the expression's size (``ExprLimits``: characters, nesting depth,
IN list length; a dispatcher's come from its config), by the message size, and by
matching every LIKE and MATCHES pattern with RE2 (``zq.core.regex``: linear in the
input, never backtracking). Chains of AND / OR are folded into balanced trees, and
arithmetic and unary minus count toward the depth, so no tree is deeper than the
limit: the parser, the compiler and the generated source (Python's own parser stops
at 200 nested parentheses) all stay within bounds.
Number literals must be finite: ``1e999`` is refused where it is written.

Values are SQL-like with NULL: a missing header or body field is NULL; comparisons
and arithmetic with NULL give NULL; AND / OR / NOT follow three-valued logic; a
filter matches only when its value is TRUE. Headers are strings; a string compared
with a number is read as a number (NULL when it is not one), with TRUE/FALSE as a
boolean. Body fields come from a JSON or msgpack object payload and keep their types.

Only the body fields an expression uses are decoded: the paths are turned into a
msgspec Struct type of just those keys, so msgspec skips everything else. A payload
whose shape does not fit (``order`` is a string where ``/order/qty`` expects an
object) falls back to a generic decode and a walk, giving NULL where the path fails.

Messages that cannot be evaluated: whatever a body holds (strings that are not valid
UTF-8, nesting past the decoder's depth, integers beyond what arithmetic or a float
holds), an expression never raises out of itself for one message's content: a filter
is then FALSE (the message does not match), and a value expression raises
``Unevaluable``, which its caller turns into that message's fate alone (a queue sets
the message aside as poison; a query counts it as NULL). The generated function's
``try`` costs nothing while nothing raises.

NOT is pushed down to the leaves at compile time (De Morgan); every leaf yields
exactly TRUE, FALSE or NULL(None), so Python's ``and`` / ``or`` then decide "is it
TRUE" correctly and short-circuit. ``reference_eval`` is the straightforward
tree-walking evaluator the property tests hold the compiled form to.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any, Callable, NamedTuple

import msgspec

from zq.core.errors import ConfigError, ProtocolError, ZqError
from zq.core.regex import PatternError, compile_pattern

EXPR_CHARS_MAX = 4096  # defaults (configurable: server.max_filter_chars etc.)
DEPTH_MAX = 64
IN_LIST_MAX = 1024
EXPR_CHARS_CEILING = 65_536  # what the config may raise them to
DEPTH_CEILING = 64  # generated code nests up to three parentheses a level; Python allows 200
IN_LIST_CEILING = 65_536
REGEX_CHARS_MAX = 256


class ExprLimits(NamedTuple):
    """How big an expression may be; the defaults, or a dispatcher's config."""

    chars: int = EXPR_CHARS_MAX
    depth: int = DEPTH_MAX
    in_items: int = IN_LIST_MAX

    def check(self, prefix: str = "expression limit ") -> ExprLimits:
        """Refuse limits outside 1..ceiling; ``prefix`` names them as the config does."""
        for name, value, ceiling in (("chars", self.chars, EXPR_CHARS_CEILING), ("depth", self.depth, DEPTH_CEILING),
                                     ("in_items", self.in_items, IN_LIST_CEILING)):
            if type(value) is not int or not 1 <= value <= ceiling:
                raise ConfigError(f"{prefix}{name} must be 1..{ceiling}, got {value!r}")
        return self


DEFAULT_LIMITS = ExprLimits()

KEYWORDS = {"AND", "OR", "NOT", "IN", "LIKE", "MATCHES", "IS", "NULL", "TRUE", "FALSE", "BETWEEN"}
COMPARISONS = {"=": "eq", "==": "eq", "!=": "ne", "<>": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
NEGATED = {"eq": "ne", "ne": "eq", "lt": "ge", "ge": "lt", "gt": "le", "le": "gt"}
PSEUDO_FIELDS = {"@topic"}


class ExprError(ProtocolError):
    """A bad expression; ``position`` is the 0-based character offset of the problem."""

    code = "bad-expression"

    def __init__(self, message: str, text: str = "", position: int = 0) -> None:
        self.position = position
        self.text = text
        detail = f"{message} at position {position}"
        if text:
            detail += f"\n  {text}\n  {' ' * position}^"
        super().__init__(detail)


class Unevaluable(ZqError):
    """A value expression could not be evaluated on one message's content (a body that
    is not valid UTF-8 inside, nested past the decoder's depth, numbers too large for
    the arithmetic...). Raised only by value expressions: a filter is simply FALSE."""

    code = "poison"
    TEXT_MAX = 200  # characters of the cause kept (a dead letter's ``zq.error``)

    def __init__(self, cause: BaseException) -> None:
        text = f"{type(cause).__name__}: {cause}"
        super().__init__(text if len(text) <= self.TEXT_MAX else text[: self.TEXT_MAX - 3] + "...")


# --------------------------------------------------------------------- tokens

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<str>'(?:[^']|'')*')
  | (?P<qid>"(?:[^"]|"")*")
  | (?P<path>/(?:[A-Za-z0-9_.$:@-]+)(?:/[A-Za-z0-9_.$:@-]+)*)
  | (?P<pseudo>@[A-Za-z_]+)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<op><=|>=|<>|!=|==|[=<>+\-*/%(),~])
    """,
    re.VERBOSE,
)


class Token:
    __slots__ = ("kind", "text", "pos")

    def __init__(self, kind: str, text: str, pos: int) -> None:
        self.kind = kind
        self.text = text
        self.pos = pos

    def __repr__(self) -> str:
        return f"Token({self.kind}, {self.text!r}, {self.pos})"


def tokenize(text: str) -> list[Token]:
    """Split ``text``; a ``/`` starts a body path only where an operand is expected."""
    out: list[Token] = []
    pos = 0
    while pos < len(text):
        operand_expected = not out or out[-1].kind == "op" and out[-1].text != ")" or out[-1].kind == "kw" and out[-1].text not in ("NULL", "TRUE", "FALSE")
        m = _TOKEN.match(text, pos)
        if m is None or (m.lastgroup == "path" and not operand_expected):
            if text[pos] == "/" and not operand_expected:
                out.append(Token("op", "/", pos))
                pos += 1
                continue
            raise ExprError(f"unexpected character {text[pos]!r}", text, pos)
        kind = m.lastgroup
        value = m.group()
        if kind == "ident" and value.upper() in KEYWORDS:
            out.append(Token("kw", value.upper(), pos))
        elif kind != "ws":
            out.append(Token(kind, value, pos))
        pos = m.end()
    out.append(Token("end", "", len(text)))
    return out


# ----------------------------------------------------------------------- tree
# Nodes are tuples (kind, pos, ...):
#   ("lit", p, value)           ("hdr", p, name)       ("body", p, (seg, ...))   ("topic", p)
#   ("not", p, e)  ("and", p, a, b)  ("or", p, a, b)   ("truth", p, e)
#   ("cmp", p, op, a, b)        ("in", p, negated, e, (lit, ...))
#   ("like", p, negated, e, pattern_text)   ("match", p, negated, e, pattern_text)
#   ("isnull", p, negated, e)   ("arith", p, op, a, b)  ("neg", p, e)

BOOLEAN_KINDS = {"not", "and", "or", "truth", "cmp", "in", "like", "match", "isnull"}


class Parser:
    def __init__(self, text: str, limits: ExprLimits = DEFAULT_LIMITS) -> None:
        if len(text) > limits.chars:
            raise ExprError(f"expression longer than {limits.chars} characters", "", 0)
        self.limits = limits
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self) -> Token:
        return self.tokens[self.i]

    def take(self) -> Token:
        t = self.tokens[self.i]
        self.i += 1
        return t

    def at(self, kind: str, text: str | None = None) -> bool:
        t = self.tokens[self.i]
        return t.kind == kind and (text is None or t.text == text)

    def expect(self, kind: str, text: str, what: str) -> Token:
        if not self.at(kind, text):
            raise self.error(f"expected {what}")
        return self.take()

    def error(self, message: str, tok: Token | None = None) -> ExprError:
        tok = tok or self.peek()
        found = "the end" if tok.kind == "end" else repr(tok.text)
        return ExprError(f"{message}, found {found}", self.text, tok.pos)

    def nest(self) -> None:
        self.depth += 1
        if self.depth > self.limits.depth:
            raise self.error(f"expression nested deeper than {self.limits.depth}")

    def parse(self) -> tuple:
        if self.at("end"):
            raise ExprError("empty expression", self.text, 0)
        node = self.parse_or()
        if not self.at("end"):
            raise self.error("expected an operator or the end")
        return node

    def parse_or(self) -> tuple:
        node = self.parse_and()
        if not self.at("kw", "OR"):
            return node
        first = self.peek()
        items = [self.boolean(node, first)]
        while self.at("kw", "OR"):
            t = self.take()
            items.append(self.boolean(self.parse_and(), t))
        return balanced("or", first.pos, items)

    def parse_and(self) -> tuple:
        node = self.parse_not()
        if not self.at("kw", "AND"):
            return node
        first = self.peek()
        items = [self.boolean(node, first)]
        while self.at("kw", "AND"):
            t = self.take()
            items.append(self.boolean(self.parse_not(), t))
        return balanced("and", first.pos, items)

    def parse_not(self) -> tuple:
        if self.at("kw", "NOT"):
            t = self.take()
            self.nest()
            node = ("not", t.pos, self.boolean(self.parse_not(), t))
            self.depth -= 1
            return node
        return self.parse_predicate()

    def boolean(self, node: tuple, op: Token) -> tuple:
        """A value used as a condition: a field is read as a boolean, a number is an error."""
        if node[0] in BOOLEAN_KINDS:
            return node
        if node[0] in ("hdr", "body", "topic"):
            return ("truth", node[1], node)
        if node[0] == "lit" and (node[2] is None or isinstance(node[2], bool)):
            return node
        raise ExprError(f"{op.text} needs a condition, not a value", self.text, node[1])

    def value(self, node: tuple, op: Token) -> tuple:
        if node[0] in BOOLEAN_KINDS:
            raise ExprError(f"{op.text!r} needs a value, not a condition", self.text, node[1])
        return node

    def parse_predicate(self) -> tuple:
        left = self.parse_sum()
        t = self.peek()
        if t.kind == "op" and t.text in COMPARISONS:
            self.take()
            right = self.parse_sum()
            return ("cmp", t.pos, COMPARISONS[t.text], self.value(left, t), self.value(right, t))
        if t.kind == "op" and t.text == "~":
            self.take()
            return self.regex_node("match", t, False, left)
        negated = False
        if t.kind == "kw" and t.text == "NOT" and self.tokens[self.i + 1].kind == "kw" and \
                self.tokens[self.i + 1].text in ("IN", "LIKE", "MATCHES", "BETWEEN"):
            self.take()
            negated = True
            t = self.peek()
        if t.kind == "kw" and t.text == "IN":
            self.take()
            return ("in", t.pos, negated, self.value(left, t), self.parse_in_list())
        if t.kind == "kw" and t.text in ("LIKE", "MATCHES"):
            self.take()
            return self.regex_node("like" if t.text == "LIKE" else "match", t, negated, left)
        if t.kind == "kw" and t.text == "BETWEEN":
            self.take()
            low = self.parse_sum()
            and_tok = self.expect("kw", "AND", "AND in BETWEEN ... AND ...")
            high = self.parse_sum()
            v = self.value(left, t)
            node = ("and", t.pos, ("cmp", t.pos, "ge", v, self.value(low, t)), ("cmp", and_tok.pos, "le", v, self.value(high, and_tok)))
            return ("not", t.pos, node) if negated else node
        if t.kind == "kw" and t.text == "IS":
            self.take()
            neg = False
            if self.at("kw", "NOT"):
                self.take()
                neg = True
            self.expect("kw", "NULL", "NULL after IS")
            return ("isnull", t.pos, neg, self.value(left, t))
        return left

    def regex_node(self, kind: str, t: Token, negated: bool, left: tuple) -> tuple:
        if not self.at("str"):
            raise self.error(f"{t.text} needs a quoted pattern")
        s = self.take()
        pattern = s.text[1:-1].replace("''", "'")
        check_pattern(kind, pattern, self.text, s.pos)
        return (kind, t.pos, negated, self.value(left, t), pattern)

    def parse_in_list(self) -> tuple:
        self.expect("op", "(", "'(' after IN")
        items = []
        while True:
            node = self.parse_unary()
            if node[0] != "lit":
                raise ExprError("IN lists hold literals only", self.text, node[1])
            items.append(node[2])
            if len(items) > self.limits.in_items:
                raise ExprError(f"IN list longer than {self.limits.in_items}", self.text, node[1])
            if self.at("op", ","):
                self.take()
                continue
            self.expect("op", ")", "',' or ')' in the IN list")
            return tuple(items)

    def parse_sum(self) -> tuple:
        depth = self.depth
        node = self.parse_product()
        while self.peek().kind == "op" and self.peek().text in "+-":
            t = self.take()
            self.nest()  # a left-deep chain: each operator is a level
            node = ("arith", t.pos, t.text, self.value(node, t), self.value(self.parse_product(), t))
        self.depth = depth
        return node

    def parse_product(self) -> tuple:
        depth = self.depth
        node = self.parse_unary()
        while self.peek().kind == "op" and self.peek().text in ("*", "/", "%"):
            t = self.take()
            self.nest()
            node = ("arith", t.pos, t.text, self.value(node, t), self.value(self.parse_unary(), t))
        self.depth = depth
        return node

    def parse_unary(self) -> tuple:
        if self.at("op", "-"):
            t = self.take()
            self.nest()
            operand = self.value(self.parse_unary(), t)
            self.depth -= 1
            if operand[0] == "lit" and isinstance(operand[2], (int, float)) and not isinstance(operand[2], bool):
                return ("lit", t.pos, -operand[2])
            return ("neg", t.pos, operand)
        return self.parse_atom()

    def parse_atom(self) -> tuple:
        t = self.take()
        if t.kind == "num":
            text = t.text
            value: Any = float(text) if any(c in text for c in ".eE") else int(text)
            if type(value) is float and not math.isfinite(value):
                raise self.error("number out of range (a float literal must be finite)", t)
            return ("lit", t.pos, value)
        if t.kind == "str":
            return ("lit", t.pos, t.text[1:-1].replace("''", "'"))
        if t.kind == "qid":
            return ("hdr", t.pos, t.text[1:-1].replace('""', '"'))
        if t.kind == "ident":
            return ("hdr", t.pos, t.text)
        if t.kind == "path":
            return ("body", t.pos, tuple(t.text[1:].split("/")))
        if t.kind == "pseudo":
            if t.text.lower() not in PSEUDO_FIELDS:
                raise self.error(f"unknown field (known: {', '.join(sorted(PSEUDO_FIELDS))})", t)
            return ("topic", t.pos)
        if t.kind == "kw" and t.text in ("NULL", "TRUE", "FALSE"):
            return ("lit", t.pos, {"NULL": None, "TRUE": True, "FALSE": False}[t.text])
        if t.kind == "op" and t.text == "(":
            self.nest()
            node = self.parse_or()
            self.depth -= 1
            self.expect("op", ")", "')'")
            return node
        raise self.error("expected a value, a field or '('", t)


def check_pattern(kind: str, pattern: str, text: str, pos: int) -> None:
    if len(pattern) > REGEX_CHARS_MAX:
        raise ExprError(f"pattern longer than {REGEX_CHARS_MAX} characters", text, pos)
    try:
        like_to_regex(pattern) if kind == "like" else compile_pattern(pattern)
    except PatternError as e:
        raise ExprError(str(e), text, pos) from None


def like_to_regex(pattern: str) -> re.Pattern[str]:
    """SQL LIKE: ``%`` any run, ``_`` one character, ``\\`` escapes the next."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return compile_pattern("".join(out), dotall=True)


def balanced(kind: str, pos: int, items: list[tuple]) -> tuple:
    """A chain of one associative operator (AND, OR: also in three-valued logic) as a
    balanced tree: 10,000 terms nest 14 deep, not 10,000; the order of evaluation
    (left to right, short-circuiting) is the chain's."""
    if len(items) == 1:
        return items[0]
    mid = len(items) // 2
    return (kind, pos, balanced(kind, pos, items[:mid]), balanced(kind, pos, items[mid:]))


def parse(text: str, limits: ExprLimits = DEFAULT_LIMITS) -> tuple:
    return Parser(text, limits).parse()


def parse_condition(text: str, limits: ExprLimits = DEFAULT_LIMITS) -> tuple:
    """Parse a filter: a bare field reads as a boolean, a number is an error."""
    p = Parser(text, limits)
    return p.boolean(p.parse(), Token("kw", "a filter", 0))


# ---------------------------------------------------------- value semantics


def to_number(v: Any) -> int | float | None:
    t = type(v)
    if t is int or t is float:
        return v
    if t is str:
        try:
            return int(v)
        except ValueError:
            try:
                f = float(v)
            except ValueError:
                return None
            return f if math.isfinite(f) else None
    return None


def _norm(a: Any, b: Any) -> tuple[Any, Any] | None:
    """Bring two non-NULL values to comparable types, or None when they are not."""
    ta, tb = type(a), type(b)
    if ta is tb and ta in (str, int, float, bool):
        return a, b
    if ta in (int, float) and tb in (int, float):
        return a, b
    if ta is str and tb in (int, float):
        n = to_number(a)
        return None if n is None else (n, b)
    if tb is str and ta in (int, float):
        n = to_number(b)
        return None if n is None else (a, n)
    if ta is bool and tb is str:
        low = b.lower()
        return (a, low == "true") if low in ("true", "false") else None
    if tb is bool and ta is str:
        low = a.lower()
        return (low == "true", b) if low in ("true", "false") else None
    return None


def _comparison(fn: Callable[[Any, Any], bool], ordered: bool) -> Callable[[Any, Any], bool | None]:
    def cmp(a: Any, b: Any) -> bool | None:
        if a is None or b is None:
            return None
        ta = type(a)
        if ta is type(b) and (ta is int or ta is str or ta is float):
            return fn(a, b)
        p = _norm(a, b)
        if p is None or (ordered and type(p[0]) is bool):
            return None
        try:
            return fn(p[0], p[1])
        except TypeError:
            return None

    return cmp


COMPARE = {
    "eq": _comparison(operator.eq, False), "ne": _comparison(operator.ne, False),
    "lt": _comparison(operator.lt, True), "le": _comparison(operator.le, True),
    "gt": _comparison(operator.gt, True), "ge": _comparison(operator.ge, True),
}


def compare(op: str, a: Any, b: Any) -> bool | None:
    return COMPARE[op](a, b)


def arith(op: str, a: Any, b: Any) -> int | float | None:
    x, y = to_number(a), to_number(b)
    if x is None or y is None:
        return None
    if op == "+":
        r = x + y
    elif op == "-":
        r = x - y
    elif op == "*":
        r = x * y
    elif op == "/":
        if y == 0:
            return None
        if type(x) is int and type(y) is int and x % y == 0:
            return x // y
        r = x / y
    else:
        if y == 0:
            return None
        r = x % y
    if type(r) is float and not math.isfinite(r):
        return None
    return r


def negate(a: Any) -> int | float | None:
    x = to_number(a)
    return None if x is None else -x


def truth(v: Any) -> bool | None:
    if v is None:
        return None
    if v is True or v is False:
        return v
    if type(v) is str:
        low = v.lower()
        if low in ("true", "false"):
            return low == "true"
    return None


def in_list(v: Any, items: tuple) -> bool | None:
    if v is None:
        return None
    unknown = False
    for item in items:
        r = compare("eq", v, item)
        if r is True:
            return True
        if r is None:
            unknown = True
    return None if unknown else False


def text_match(regex: Any, v: Any, search: bool) -> bool | None:
    if v is None:
        return None
    if type(v) is not str:
        if type(v) in (int, float):
            v = str(v)
        else:
            return None
    try:
        return (regex.search(v) if search else regex.fullmatch(v)) is not None
    except UnicodeEncodeError:  # a lone surrogate (a JSON body's "\udcff") is no text RE2 reads
        return None


def walk(value: Any, path: tuple[str, ...]) -> Any:
    """Follow ``path`` through decoded JSON/msgpack (a numeric segment indexes a list)."""
    for seg in path:
        if type(value) is dict:
            value = value.get(seg)
        elif type(value) is list and seg.isdigit():
            i = int(seg)
            value = value[i] if i < len(value) else None
        else:
            return None
        if value is None:
            return None
    if type(value) in (dict, list):
        return None  # an object or array is not a value the language compares
    return value


def is_msgpack_map(payload: bytes) -> bool:
    b = payload[0]
    return 0x80 <= b <= 0x8F or b in (0xDE, 0xDF)


def body_kind(payload: bytes, headers: dict[str, str]) -> str | None:
    """Which decoder reads the body: 'json', 'msgpack', or None (not an object)."""
    if not payload:
        return None
    ct = headers.get("content-type")
    if ct is not None and "msgpack" in ct:
        return "msgpack"
    first = payload[:1]
    if first in b" \t\r\n":
        first = payload.lstrip()[:1]
    if first == b"{":
        return "json"
    if is_msgpack_map(payload):
        return "msgpack"
    return None


# -------------------------------------------------------------- body access


class BodyReader:
    """Decodes only the body fields an expression uses (see the module docstring).

    ``root(payload, headers)`` returns an instance of ``struct`` (the fast case), a
    generic decoded value (the payload did not fit the struct), or None (not an
    object). ``access_code`` writes the Python that reads one path from the first,
    ``slow`` reads every path from the second.
    """

    def __init__(self, paths: list[tuple[str, ...]]) -> None:
        self.paths = paths
        self.none = (None,) * len(paths)
        self.tree: dict = {}
        for path in paths:
            node = self.tree
            for seg in path:
                if seg.isdigit():
                    break  # array index: decode generically below this point
                node = node.setdefault(seg, {})
        self.struct = self._struct_for(self.tree, "Root")
        self.json = msgspec.json.Decoder(self.struct)
        self.msgpack = msgspec.msgpack.Decoder(self.struct)

    def _struct_for(self, tree: dict, name: str) -> type:
        fields = []
        rename = {}
        for i, (key, sub) in enumerate(tree.items()):
            attr = f"f{i}"
            rename[attr] = key
            typ: Any = Any if not sub else (self._struct_for(sub, f"{name}_{i}") | None)
            fields.append((attr, typ, None))
        return msgspec.defstruct(name, fields, rename=rename, gc=False)

    def access_code(self, path: tuple[str, ...], root: str, gen: "CodeGen") -> str:
        """Python reading ``path`` from a struct instance named ``root``, NULL-safe."""
        node = self.tree
        expr = root
        rest: tuple[str, ...] = ()
        for k, seg in enumerate(path):
            if seg.isdigit():
                rest = path[k:]
                break
            attr = f"f{list(node).index(seg)}"
            node = node[seg]
            if k == 0:
                expr = f"{root}.{attr}"
            else:
                t = gen.temp()
                expr = f"(None if ({t} := {expr}) is None else {t}.{attr})"
        if rest:
            return f"_walk({expr}, {rest!r})"
        t = gen.temp()
        return f"(None if type({t} := {expr}) in _containers else {t})"

    def root(self, payload: bytes, headers: dict[str, str]) -> Any:
        first = payload[:1]
        if first == b"{" and "content-type" not in headers:
            decoder = self.json
        else:
            kind = body_kind(payload, headers)
            if kind is None:
                return None
            decoder = self.json if kind == "json" else self.msgpack
        try:
            return decoder.decode(payload)
        except msgspec.ValidationError:
            try:
                return (msgspec.json.decode if decoder is self.json else msgspec.msgpack.decode)(payload)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return None
        except msgspec.DecodeError:
            return None

    def slow(self, value: Any) -> tuple:
        if value is None:
            return self.none
        return tuple(walk(value, p) for p in self.paths)

    def read(self, payload: bytes, headers: dict[str, str]) -> tuple:
        """Every path's value (the straightforward form, for tests and tools)."""
        root = self.root(payload, headers)
        return self.slow(_as_dict(root) if type(root) is self.struct else root)


def _as_dict(value: Any) -> Any:
    """A decoded struct back to plain dicts keyed by the JSON names."""
    if isinstance(value, msgspec.Struct):
        return {key: _as_dict(getattr(value, attr))
                for attr, key in zip(value.__struct_fields__, value.__struct_encode_fields__)}
    return value


# ------------------------------------------------------------------ compile


class Compiled:
    """A compiled expression: ``fn(headers, payload, topic)`` and what it reads."""

    __slots__ = ("text", "fn", "headers_used", "body_paths", "uses_topic", "source")

    def __init__(self, text: str, fn: Callable, headers_used: set[str], body_paths: list, uses_topic: bool, source: str) -> None:
        self.text = text
        self.fn = fn
        self.headers_used = headers_used
        self.body_paths = body_paths
        self.uses_topic = uses_topic
        self.source = source

    def __call__(self, headers: dict[str, str], payload: bytes, topic: str = "") -> Any:
        return self.fn(headers, payload, topic)

    @property
    def uses_body(self) -> bool:
        return bool(self.body_paths)

    def __repr__(self) -> str:
        return f"Compiled({self.text!r})"


def push_not(node: tuple, negate_it: bool = False) -> tuple:
    """Move NOT to the leaves (De Morgan) so every inner node is AND / OR."""
    kind = node[0]
    if kind == "not":
        return push_not(node[2], not negate_it)
    if kind in ("and", "or"):
        flipped = {"and": "or", "or": "and"}[kind] if negate_it else kind
        return (flipped, node[1], push_not(node[2], negate_it), push_not(node[3], negate_it))
    if not negate_it:
        return node
    if kind == "cmp":
        return ("cmp", node[1], NEGATED[node[2]], node[3], node[4])
    if kind in ("in", "like", "match", "isnull"):
        return (kind, node[1], not node[2], *node[3:])
    if kind == "lit":
        return ("lit", node[1], None if node[2] is None else not node[2])
    return ("notv", node[1], node)  # truth(field): NOT keeps NULL


class CodeGen:
    def __init__(self) -> None:
        self.consts: dict[str, Any] = {}
        self.headers: dict[str, str] = {}  # header name -> local variable
        self.paths: list[tuple[str, ...]] = []
        self.uses_topic = False
        self.temps = 0

    def const(self, value: Any) -> str:
        name = f"_k{len(self.consts)}"
        self.consts[name] = value
        return name

    def temp(self) -> str:
        self.temps += 1
        return f"_t{self.temps}"

    def field(self, node: tuple) -> str:
        kind = node[0]
        if kind == "hdr":
            var = self.headers.get(node[2])
            if var is None:
                var = self.headers[node[2]] = f"_h{len(self.headers)}"
            return var
        if kind == "body":
            path = node[2]
            if path not in self.paths:
                self.paths.append(path)
            return f"_b{self.paths.index(path)}"
        self.uses_topic = True
        return "t"

    def gen(self, node: tuple) -> str:
        kind = node[0]
        if kind == "lit":
            return repr(node[2])
        if kind in ("hdr", "body", "topic"):
            return self.field(node)
        if kind == "and":
            return f"({self.gen(node[2])} and {self.gen(node[3])})"
        if kind == "or":
            return f"({self.gen(node[2])} or {self.gen(node[3])})"
        if kind == "truth":
            return f"_truth({self.gen(node[2])})"
        if kind == "notv":
            t = self.temp()
            return f"(None if ({t} := _truth({self.gen(node[2][2])})) is None else not {t})"
        if kind == "cmp":
            op, a, b = node[2], node[3], node[4]
            # Fast path: a header or @topic against a string literal is a plain string compare.
            if op in ("eq", "ne") and a[0] in ("hdr", "topic") and b[0] == "lit" and type(b[2]) is str:
                a, b = b, a
            if op in ("eq", "ne") and b[0] in ("hdr", "topic") and a[0] == "lit" and type(a[2]) is str:
                var = self.field(b)
                py = "==" if op == "eq" else "!="
                return f"(None if {var} is None else {var} {py} {a[2]!r})"
            if op not in ("eq", "ne") and b[0] == "lit" and type(b[2]) in (int, float):
                # Fast path: a number against a number literal is a plain compare.
                t = self.temp()
                py = {"lt": "<", "le": "<=", "gt": ">", "ge": ">="}[op]
                return (f"(None if ({t} := {self.gen(a)}) is None else {t} {py} {b[2]!r} "
                        f"if type({t}) is int or type({t}) is float else _{op}({t}, {b[2]!r}))")
            return f"_{op}({self.gen(a)}, {self.gen(b)})"
        if kind == "in":
            negated, e, items = node[2], node[3], node[4]
            if e[0] in ("hdr", "topic") and all(type(x) is str for x in items):
                var = self.field(e)
                k = self.const(frozenset(items))
                py = "not in" if negated else "in"
                return f"(None if {var} is None else {var} {py} {k})"
            k = self.const(items)
            inner = f"_in({self.gen(e)}, {k})"
            return self.maybe_not(inner, negated)
        if kind in ("like", "match"):
            negated, e, pattern = node[2], node[3], node[4]
            regex = like_to_regex(pattern) if kind == "like" else compile_pattern(pattern)
            k = self.const(regex)
            inner = f"_text({k}, {self.gen(e)}, {kind == 'match'})"
            return self.maybe_not(inner, negated)
        if kind == "isnull":
            if node[3][0] == "lit":
                return repr((node[3][2] is None) != node[2])
            return f"({self.gen(node[3])} is {'not ' if node[2] else ''}None)"
        if kind == "arith":
            return f"_arith({node[2]!r}, {self.gen(node[3])}, {self.gen(node[4])})"
        if kind == "neg":
            return f"_negate({self.gen(node[2])})"
        raise AssertionError(f"unknown node {kind}")

    def maybe_not(self, inner: str, negated: bool) -> str:
        if not negated:
            return inner
        t = self.temp()
        return f"(None if ({t} := {inner}) is None else not {t})"


HELPERS = {
    **{f"_{op}": fn for op, fn in COMPARE.items()},
    "_truth": truth, "_in": in_list, "_text": text_match, "_arith": arith, "_negate": negate,
    "_walk": walk, "_containers": (dict, list), "type": type, "int": int, "float": float, "_Error": msgspec.MsgspecError,
    "_Exception": Exception, "_Unevaluable": Unevaluable,
}


def _compile(text: str, want_condition: bool, limits: ExprLimits) -> Compiled:
    if want_condition:
        tree = push_not(parse_condition(text, limits))
    else:
        tree = parse(text, limits)
    if not want_condition and tree[0] in BOOLEAN_KINDS:
        raise ExprError("expected a value (a field or arithmetic), not a condition", text, tree[1])
    g = CodeGen()
    body = g.gen(tree)
    lines = ["def _expr(h, p, t):", "  try:"]
    for name, var in g.headers.items():
        lines.append(f"    {var} = h.get({name!r})")
    if g.paths:
        reader = BodyReader(g.paths)
        rd, st = g.const(reader), g.const(reader.struct)
        access = [reader.access_code(path, "_r", g) for path in g.paths]
        names = ", ".join(f"_b{i}" for i in range(len(g.paths)))
        dec = g.const(reader.json.decode)
        lines.append("    try:")
        lines.append(f"        _r = {dec}(p) if p and p[0] == 123 and 'content-type' not in h else {rd}.root(p, h)")
        lines.append("    except _Error:")
        lines.append(f"        _r = {rd}.root(p, h)")
        lines.append(f"    if type(_r) is {st}:")
        for i, code in enumerate(access):
            lines.append(f"        _b{i} = {code}")
        lines.append("    else:")
        lines.append(f"        {names}{',' if len(g.paths) == 1 else ''} = {rd}.slow(_r)")
    lines.append(f"    return ({body}) is True" if want_condition else f"    return {body}")
    # Total over every message (see "Messages that cannot be evaluated" above): a body
    # the decoders or the helpers cannot read never raises out of an expression.
    lines.append("  except _Exception as _e:")
    lines.append("    return False" if want_condition else "    raise _Unevaluable(_e) from None")
    source = "\n".join(lines)
    scope: dict[str, Any] = {"__builtins__": {}}
    scope.update(HELPERS)
    scope.update(g.consts)
    exec(compile(source, "<zq expression>", "exec"), scope)  # noqa: S102 -- generated from the tree; see module docstring
    return Compiled(text, scope["_expr"], set(g.headers), list(g.paths), g.uses_topic, source)


def compile_filter(text: str, limits: ExprLimits = DEFAULT_LIMITS) -> Compiled:
    """A condition: calling it returns True exactly when the expression is TRUE."""
    return _compile(text, True, limits)


def compile_value(text: str, limits: ExprLimits = DEFAULT_LIMITS) -> Compiled:
    """A value expression (priority, aggregates): returns the value or None (NULL)."""
    return _compile(text, False, limits)


# --------------------------------------------------------- reference evaluator


def reference_eval(node: tuple, headers: dict[str, str], body: Any, topic: str = "") -> Any:
    """Evaluate a parsed tree directly, with full three-valued logic (for tests)."""

    def ev(n: tuple) -> Any:
        kind = n[0]
        if kind == "lit":
            return n[2]
        if kind == "hdr":
            return headers.get(n[2])
        if kind == "body":
            return walk(body, n[2])
        if kind == "topic":
            return topic
        if kind == "not":
            v = ev(n[2])
            return None if v is None else not v
        if kind == "and":
            a, b = ev(n[2]), ev(n[3])
            if a is False or b is False:
                return False
            return None if a is None or b is None else True
        if kind == "or":
            a, b = ev(n[2]), ev(n[3])
            if a is True or b is True:
                return True
            return None if a is None or b is None else False
        if kind == "truth":
            return truth(ev(n[2]))
        if kind == "cmp":
            return compare(n[2], ev(n[3]), ev(n[4]))
        if kind == "in":
            r = in_list(ev(n[3]), n[4])
            return r if not n[2] or r is None else not r
        if kind in ("like", "match"):
            regex = like_to_regex(n[4]) if kind == "like" else compile_pattern(n[4])
            r = text_match(regex, ev(n[3]), kind == "match")
            return r if not n[2] or r is None else not r
        if kind == "isnull":
            return (ev(n[3]) is None) != n[2]
        if kind == "arith":
            return arith(n[2], ev(n[3]), ev(n[4]))
        if kind == "neg":
            return negate(ev(n[2]))
        raise AssertionError(kind)

    return ev(node)
