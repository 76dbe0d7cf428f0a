"""Aggregates over a queue's available messages: ``query(queue, group_by, aggregates)``.

AMPS lets a queue be queried like a view (e.g. total value of pending orders per
region). Here the group keys and the aggregated values are expressions of the
expression language, compiled once; NULL values are skipped as in SQL (``count``
counts rows, ``count(EXPR)`` counts non-NULL values).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from zq.core import expr
from zq.core import records as R
from zq.core.errors import ProtocolError

FUNCTIONS = ("count", "sum", "avg", "min", "max")
AGGREGATES_MAX = 32
GROUPS_MAX = 100_000  # distinct group-by keys in one answer
_CALL = re.compile(r"^\s*([A-Za-z]+)\s*\((.*)\)\s*$", re.DOTALL)


class Aggregate:
    __slots__ = ("label", "fn", "value")

    def __init__(self, label: str, fn: str, value: expr.Compiled | None) -> None:
        self.label = label
        self.fn = fn
        self.value = value


def parse_aggregate(text: str, limits: expr.ExprLimits = expr.DEFAULT_LIMITS) -> Aggregate:
    """``count`` | ``count(EXPR)`` | ``sum(EXPR)`` | ``avg(EXPR)`` | ``min(EXPR)`` | ``max(EXPR)``."""
    label = text.strip()
    if label.lower() in ("count", "count(*)"):
        return Aggregate(label, "count", None)
    m = _CALL.match(label)
    if m is None or m.group(1).lower() not in FUNCTIONS:
        raise ProtocolError(f"aggregate {label!r}: expected one of {', '.join(f + '(EXPR)' for f in FUNCTIONS)} or count")
    try:
        value = expr.compile_value(m.group(2), limits)
    except expr.ExprError as e:
        raise expr.ExprError(f"aggregate {label!r}: {e.args[0].splitlines()[0]}") from None
    return Aggregate(label, m.group(1).lower(), value)


def _value(c: expr.Compiled, h: dict[str, str], p: bytes, t: str) -> Any:
    """A value expression over one message; NULL where its content cannot be evaluated
    (``expr.Unevaluable``): a query reads messages, it never fails on one."""
    try:
        return c.fn(h, p, t)
    except expr.Unevaluable:
        return None


class Query:
    """A compiled query: feed messages with ``add``, read rows with ``rows``."""

    def __init__(self, group_by: list[str], aggregates: list[str], filter: str | None = None,
                 limits: expr.ExprLimits = expr.DEFAULT_LIMITS) -> None:
        if len(aggregates) > AGGREGATES_MAX or len(group_by) > AGGREGATES_MAX:
            raise ProtocolError(f"at most {AGGREGATES_MAX} group-by keys and aggregates")
        self.group_by = [(g, expr.compile_value(g, limits)) for g in group_by]
        self.aggregates = [parse_aggregate(a, limits) for a in (aggregates or ["count"])]
        self.filter = expr.compile_filter(filter, limits) if filter else None
        self.groups: dict[tuple, list[Any]] = {}
        self.scanned = 0

    def add(self, m: R.Message) -> None:
        self.scanned += 1
        h, p, t = m.headers, m.payload, m.topic
        if self.filter is not None and not self.filter.fn(h, p, t):
            return
        key = tuple(_value(c, h, p, t) for _, c in self.group_by)
        state = self.groups.get(key)
        if state is None:
            if len(self.groups) >= GROUPS_MAX:
                raise ProtocolError(f"more than {GROUPS_MAX} groups in one query")
            state = self.groups[key] = [[0, None] for _ in self.aggregates]  # count, accumulator
        for agg, acc in zip(self.aggregates, state):
            if agg.value is None:
                acc[0] += 1
                continue
            v = _value(agg.value, h, p, t)
            if v is None:
                continue
            if agg.fn in ("sum", "avg"):
                v = expr.to_number(v)
                if v is None:
                    continue
                try:
                    acc[1] = v if acc[1] is None else acc[1] + v
                except OverflowError:  # a huge int beside a float: the sum is beyond a float
                    acc[1] = math.inf if (acc[1] > 0) == (v > 0) else math.nan
            elif agg.fn in ("min", "max"):
                cur = acc[1]
                if cur is None:
                    acc[1] = v
                else:
                    better = expr.compare("lt" if agg.fn == "min" else "gt", v, cur)
                    if better:
                        acc[1] = v
            acc[0] += 1

    def add_all(self, messages: Iterable[R.Message]) -> "Query":
        for m in messages:
            self.add(m)
        return self

    def rows(self) -> list[dict[str, Any]]:
        """One row per group-by key; without group-by, exactly one row (count 0 when empty)."""
        out = []
        groups = self.groups
        if not self.group_by and not groups:
            groups = {(): [[0, None] for _ in self.aggregates]}
        for key, state in groups.items():
            row: dict[str, Any] = {label: k for (label, _), k in zip(self.group_by, key)}
            for agg, (count, acc) in zip(self.aggregates, state):
                if agg.fn == "count":
                    row[agg.label] = count
                elif agg.fn == "avg":
                    row[agg.label] = acc / count if count else None
                else:
                    row[agg.label] = acc
            out.append(row)
        out.sort(key=lambda r: tuple((v is None, str(type(v)), v) for v in (r[label] for label, _ in self.group_by)))
        return out
