"""Pure: two stats snapshots and the time between them -> what `zq top` shows."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

SPARK_POINTS = 60  # one minute of depth at the default 1 s interval


@dataclass
class QueueRow:
    name: str
    depth: int
    leased: int
    in_rate: float
    out_rate: float
    oldest_ms: int | None
    redelivered: int
    lost: int  # settles of deliveries no longer live (fenced leases): late workers
    expired: int
    dead_lettered: int
    consumers: int
    p50_ms: float | None
    p99_ms: float | None
    depth_history: list[int]
    oldest_bookmark: int | None = None
    delayed: int = 0  # waiting for a time: a retry's backoff or a publish's delay (part of depth)


@dataclass
class ConsumerRow:
    name: str
    queue: str
    used: int
    backlog: int
    ack_rate: float
    mean_ms: float | None
    heard_ms_ago: int | None
    given_back: int | None = None  # reclaimable: deliveries it gave back unstarted (None: not reclaimable)


@dataclass
class GroupRow:
    queue: str
    groups: int
    in_flight: int
    busiest: list[dict]


@dataclass
class TenantRow:
    """A fair queue's tenants holding most: [{tenant, weight, held}], most first."""
    queue: str
    tenants: list[dict]


@dataclass
class TopModel:
    endpoint: str
    version: str
    uptime_ms: int
    durability: str
    journal_bytes: int
    journal_map_bytes: int
    rates: dict[str, float]
    publishers: int
    workers: int
    queues: list[QueueRow]
    consumers: list[ConsumerRow]
    groups: list[GroupRow]
    sort: str = "rate"
    connected: bool = True
    note: str = ""  # why it is not connected (an exception's name), or "connecting"
    silent_s: float | None = None  # not connected: seconds since the server last answered a STATS
    queues_total: int = 0  # queues there are; STATS lists at most 1,000 (the busiest)
    oldest_why: str | None = None  # why the top queue's oldest waiting message waits (zq explain)
    tenants: list[TenantRow] = field(default_factory=list)
    replicas_ack: int = 0  # [cluster]: confirmations wait for this many standbys
    standbys: list[dict] = field(default_factory=list)  # [{name, position, lag_records, heard_ms_ago}]
    cluster: dict | None = None  # an elected cluster's leader: {role, node, epoch, isr, serving, ...}


def oldest_to_explain(m: TopModel) -> tuple[str, int] | None:
    """The message ``zq top`` explains: the oldest waiting one of the first queue shown."""
    for q in m.queues:
        if q.depth and q.oldest_bookmark is not None:
            return q.name, q.oldest_bookmark
    return None


def why_line(queue: str, doc: dict) -> str:
    """One line from an explain answer: the oldest message of ``queue`` and what holds it."""
    line = f"oldest waiting in {queue} (bookmark {doc['bookmark']}): " + "; ".join(doc.get("why", []))
    c = doc.get("causes")
    if c:  # its earlier deliveries, and how they ended
        ends = [f"{n} {label}" for n, label in ((c["failed"], "failed"), (c["lease_expired"], "lease expired"),
                                                (c["consumer_gone"], "consumer gone"), (c["cancelled"], "cancelled")) if n]
        last = f", last error {c['last_error'][:80]!r}" if c.get("last_error") else ""
        line += f"; earlier deliveries: {', '.join(ends)}{last}"
    return line


@dataclass
class History:
    """What the model remembers across frames: depth samples per queue."""

    depth: dict[str, deque[int]] = field(default_factory=dict)

    def add(self, name: str, depth: int) -> list[int]:
        d = self.depth.setdefault(name, deque(maxlen=SPARK_POINTS))
        d.append(depth)
        return list(d)


def percentile_ms(buckets_ms: list[int], counts: list[int], p: float) -> float | None:
    """The upper bound of the bucket holding the p-th percentile (None: no samples)."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = total * p / 100, 0
    for edge, count in zip([*buckets_ms, None], counts):
        seen += count
        if seen >= rank:
            return float(edge) if edge is not None else float("inf")
    return float("inf")  # pragma: no cover


def measured_percentile_ms(counts: dict, p: float) -> float | None:
    """The p-th percentile of latencies kept as {ms (two significant digits): count}."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank, seen = total * p / 100, 0
    for ms in sorted(counts):
        seen += counts[ms]
        if seen >= rank:
            return float(ms)
    return float(max(counts))  # pragma: no cover


def rate(curr: int, prev: int | None, dt_s: float) -> float:
    if prev is None or dt_s <= 0:
        return 0.0
    return max(curr - prev, 0) / dt_s


SORTS = {
    "depth": lambda r: (-r.depth, r.name),
    "rate": lambda r: (-(r.in_rate + r.out_rate), -r.depth, r.name),  # the default: the busy ones first
    "latency": lambda r: (-(r.p99_ms if r.p99_ms is not None else -1), r.name),
    "name": lambda r: r.name,
}
DEFAULT_SORT = "rate"


def is_idle(q: QueueRow) -> bool:
    """Nothing came in, went out or is leased: what ``zq top`` collapses when space is short."""
    return q.in_rate == 0 and q.out_rate == 0 and q.leased == 0


def resorted(m: TopModel, sort: str) -> TopModel:
    """The same frame in another order (a sort key takes effect before the next answer)."""
    return replace(m, queues=sorted(m.queues, key=SORTS.get(sort, SORTS[DEFAULT_SORT])), sort=sort)


def build(endpoint: str, prev: dict | None, curr: dict, dt_ms: int, history: History, sort: str = DEFAULT_SORT) -> TopModel:
    dt = dt_ms / 1000
    prevq = (prev or {}).get("queues", {})
    queues, consumers, groups, tenants = [], [], [], []
    for name, q in curr["queues"].items():
        p = prevq.get(name)
        lat = q["ack_latency"]
        delta = [c - (p["ack_latency"]["counts"][i] if p else 0) for i, c in enumerate(lat["counts"])]
        if "ms" in lat:  # measured values (a dispatcher from before them has the histogram only)
            was = {int(k): v for k, v in p["ack_latency"].get("ms", {}).items()} if p else {}
            now = {int(k): v - was.get(int(k), 0) for k, v in lat["ms"].items()}
            p50, p99 = measured_percentile_ms(now, 50), measured_percentile_ms(now, 99)
        else:
            p50, p99 = percentile_ms(lat["buckets_ms"], delta, 50), percentile_ms(lat["buckets_ms"], delta, 99)
        queues.append(QueueRow(
            name=name, depth=q["depth"], leased=q["leased"],
            in_rate=rate(q["published"], p and p["published"], dt), out_rate=rate(q["acked"], p and p["acked"], dt),
            oldest_ms=q.get("oldest_ms"), redelivered=q["redelivered"], lost=q.get("lost", 0), expired=q["expired"],
            dead_lettered=q["dead_lettered"], consumers=len(q["consumers"]),
            p50_ms=p50, p99_ms=p99,
            depth_history=history.add(name, q["depth"]), oldest_bookmark=q.get("oldest_bookmark"),
            delayed=q.get("delayed", 0),
        ))
        before = {c["sub"]: c for c in (p or {}).get("consumers", [])}
        for c in q["consumers"]:
            b = before.get(c["sub"])
            acked = c["acked"] - (b["acked"] if b else 0)
            busy = c["busy_ms"] - (b["busy_ms"] if b else 0)
            consumers.append(ConsumerRow(
                name=c.get("name") or c["consumer"], queue=name, used=c["used"], backlog=c["backlog"],
                ack_rate=rate(c["acked"], b and b["acked"], dt), mean_ms=busy / acked if acked > 0 else None,
                heard_ms_ago=c.get("heard_ms_ago"), given_back=c.get("given_back") if c.get("reclaimable") else None,
            ))
        if "group_summary" in q and q["group_summary"]["count"]:
            gs = q["group_summary"]
            groups.append(GroupRow(name, gs["count"], gs["in_flight"], gs["busiest"]))
        if q.get("tenants"):
            tenants.append(TenantRow(name, q["tenants"]))
    queues.sort(key=SORTS.get(sort, SORTS[DEFAULT_SORT]))
    consumers.sort(key=lambda c: (c.queue, c.name))
    srv = curr["server"]
    return TopModel(
        endpoint=endpoint, version=srv["version"], uptime_ms=srv["uptime_ms"], durability=srv["durability"],
        journal_bytes=srv["journal_bytes"], journal_map_bytes=srv.get("journal_map_bytes", 0), rates=srv.get("rates", {}),
        publishers=srv.get("publishers", 0), workers=srv.get("workers", 0), queues_total=srv.get("queues", 0),
        queues=queues, consumers=consumers, groups=groups, sort=sort, tenants=tenants,
        replicas_ack=srv.get("replication", {}).get("replicas_ack", 0),
        standbys=srv.get("replication", {}).get("standbys", []),
        cluster=srv.get("replication", {}).get("cluster"),
    )


def disconnected(endpoint: str, last: TopModel | None, reason: str, silent_s: float | None = None) -> TopModel:
    """The frame shown while the server is away: the last figures, marked stale."""
    if last is None:
        return TopModel(endpoint, "?", 0, "?", 0, 0, {}, 0, 0, [], [], [], connected=False, note=reason)
    return replace(last, connected=False, note=reason, silent_s=silent_s)


def late_after(interval: float) -> float:
    """How long a STATS may go unanswered before ``zq top`` says so (answers take ms)."""
    return min(0.5, max(interval / 2, 0.2))


def current(endpoint: str, last: TopModel | None, answered_at: float | None, asked_at: float | None,
            error: str | None, now: float, interval: float) -> TopModel:
    """What to show ``now``: the last answer while it is fresh; marked stale ("no answer for
    N s") once a request has waited past ``late_after`` or failed (``error``), so the
    header stops saying "connected" within about one interval of the server going quiet."""
    if last is None or answered_at is None:
        return disconnected(endpoint, None, error or "connecting")
    waiting = asked_at is not None and asked_at > answered_at and now - asked_at > late_after(interval)
    if error is None and not waiting:
        return last
    return disconnected(endpoint, last, error or "", silent_s=max(0.0, now - answered_at))
