"""``zq.toml``: typed with msgspec; durations and sizes are strings with units.

A bad file fails at start with a message naming the key (``$.queue[0].lease``).
With no file at all, ``Config()`` is the embedded default of DESIGN.md.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any
from pathlib import Path

import msgspec

from zq.core import limits
from zq.core.errors import ConfigError
from zq.wire import DEFAULT_ENDPOINT
from zq.core.expr import DEFAULT_LIMITS, DEPTH_MAX, EXPR_CHARS_MAX, IN_LIST_MAX, ExprLimits
from zq.core.regex import PatternError, compile_pattern
from zq.core.settings import DEFAULT_BACKOFF_MS, QueueSettings, default_dead_letter
from zq.server.security import SecuritySection, check_section

DEFAULT_DATA = "./zq-data"
REPLICAS_ACK_MAX = 16  # standbys a confirmation may wait for

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB)?\s*$")
_SIZE_BYTES = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
               "KB": 10**3, "MB": 10**6, "GB": 10**9}


def duration_ms(text: str | int, key: str) -> int:
    """'30s' -> 30000. A bare integer is taken as milliseconds."""
    if isinstance(text, int):
        ms = text
    else:
        m = _DURATION.match(text) if isinstance(text, str) else None
        if not m:
            raise ConfigError(f"{key}: {str(text)[:80]!r} is not a duration (use e.g. '500ms', '30s', '5m', '1h', '7d')")
        value = float(m.group(1)) * _DURATION_MS[m.group(2)]
        if not value <= limits.DURATION_MS_MAX:  # also catches inf
            raise ConfigError(f"{key}: {text[:80]!r} is longer than 100 years")
        ms = int(value)
    if not -limits.DURATION_MS_MAX <= ms <= limits.DURATION_MS_MAX:
        raise ConfigError(f"{key}: {ms} ms is longer than 100 years")
    return ms


def size_bytes(text: str | int, key: str) -> int:
    if isinstance(text, int):
        n = text
    else:
        m = _SIZE.match(text) if isinstance(text, str) and len(text) < 64 else None
        if not m:
            raise ConfigError(f"{key}: {str(text)[:80]!r} is not a size (use e.g. '64KiB', '16MiB')")
        n = int(m.group(1)) * _SIZE_BYTES[m.group(2)]
    if not -limits.COUNT_MAX <= n <= limits.COUNT_MAX:
        raise ConfigError(f"{key}: {n} bytes is beyond 2**53")
    return n


DURATION_KEYS = {"lease", "expiration", "dedup_window", "fsync_interval", "heartbeat", "retention", "max_lease_age"}
SIZE_KEYS = {"max_bytes", "max_message_size", "max_unread", "max_unread_total"}


def explain(exc: msgspec.ValidationError) -> str:
    """msgspec's message, with the fix for the mistakes people make most."""
    text = str(exc)
    where = text.rsplit("at `$.", 1)[-1].rstrip("`") if "at `$." in text else ""
    key = where.rsplit(".", 1)[-1]
    if where == "queue" and "got `object`" in text:
        return "write [[queue]], not [queue]: one [[queue]] table per queue (an array of tables)"
    if key in DURATION_KEYS and "Expected `str`" in text:
        return f"{where}: a duration needs its unit, in quotes: {key} = \"30s\" (units ms, s, m, h, d)"
    if key in SIZE_KEYS and "Expected `str" in text:
        return f"{where}: a size needs its unit, in quotes: {key} = \"64MiB\" (B, KiB, MiB, GiB, TiB)"
    return text


class ServerSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    data: str = DEFAULT_DATA
    bind: list[str] = msgspec.field(default_factory=lambda: [DEFAULT_ENDPOINT])
    durability: str = "batch"
    fsync_interval: str = "1s"
    auto_queues: bool = True
    heartbeat: str = "1s"
    heartbeat_liveness: int = 3  # missed heartbeats before a peer is declared dead
    retention: str = "7d"
    max_message_size: str = "16MiB"
    metrics: str | None = None
    max_connections: int = limits.CONNECTIONS_DEFAULT  # sessions (HELLO) at once
    max_subscriptions_per_connection: int = limits.SUBSCRIPTIONS_PER_CONNECTION_DEFAULT  # incl. claims
    max_replays_per_connection: int = 64
    max_replays: int = 1024  # open replays, all connections together
    max_range_requests: int = 64  # RANGE requests waiting for the reader thread, all connections together
    max_unread: str = "64MiB"  # bytes sent to one peer it has not read (zq.server.outflow)
    max_unread_total: str = "1GiB"  # ... to every peer together (the biggest holders wait first)
    max_filter_chars: int = EXPR_CHARS_MAX  # a client's filter, query or value expression
    max_filter_depth: int = DEPTH_MAX  # nesting (parentheses, NOT, arithmetic, unary minus)
    max_filter_in_items: int = IN_LIST_MAX  # literals in one IN list


class QueueSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    topics: str | None = None
    publish_to: str | None = None
    semantics: str = "at-least-once"
    fairness: str | None = None
    lease: str = "30s"
    max_per_subscription_backlog: int = 100
    max_cancels: int = 0
    max_deliveries: int = 20
    expiration: str | None = None
    dead_letter: str | None = None  # None: "<name>.dead" (settings.default_dead_letter); "": dropped
    group_header: str | None = "group"
    group_policy: str = "sequenced"
    max_groups: int = limits.GROUPS_PER_QUEUE_MAX
    allow_ack_unleased: bool = False
    filter: str | None = None
    dedup_window: str = "24h"
    leasing: str = "strict"
    lvq_key: str | None = None
    barrier: str | None = None
    browse_only: bool = False
    priority: str | None = None
    sort_key: str | None = None
    target_queue_depth: int = 0
    max_depth: int = 0
    max_bytes: str | int = 0
    overflow: str = "reject"
    resume_percent: int = 90
    backoff: list[str] | None = None  # retry schedule: ["1s", "10s", "1m"]; the last step repeats; [] none;
    # None: settings.DEFAULT_BACKOFF_MS (1s, 5s, 30s, 1m, 5m), as auto-created queues have
    backoff_jitter: float = 0.1
    max_lease_age: str | None = None  # leases of connected consumers renew until a delivery is this old
    max_failures: int = 0
    max_lease_expiries: int = 0
    max_consumer_gone: int = 0
    tenant_header: str | None = None  # the header naming a message's tenant: a fair share between tenants
    tenant_weights: dict[str, int] = {}  # tenant -> weight (1..1000); others get tenant_default_weight
    tenant_default_weight: int = 1
    priority_aging: int = 0  # with priority: one level is worth this many messages of waiting (0: strict)


class ClusterSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    replicas_ack: int = 0  # a publish is confirmed once this many standbys have it synced (0: the leader's commit)
    # An elected cluster (zq.server.cluster): with ``zookeeper`` set, `zq serve` is one node
    # of it, leading or standing by as ZooKeeper decides; the same file on every node but
    # for ``node`` (or `zq serve --node`) and the binds.
    zookeeper: str = ""  # "host:port[,host:port...]"
    path: str = "/zq/default"  # the cluster's znode: one per cluster
    node: str = ""  # this node's name, unique in the cluster
    advertise: str = ""  # the endpoint others reach this node on (default: the first bind)
    session_timeout: str = "2s"  # ZooKeeper's session: how long a silent leader keeps leading
    min_insync: int = 0  # with replicas_ack: publishes wait while fewer standbys are in sync
    replica_lag: str = "3s"  # a standby that has not caught up for this long leaves the in-sync set
    # Without ``zookeeper``: what a hand-started standby (``zq standby``, $ZQ_STANDBY_SECRET)
    # must show for its position to count (with [security], its key's journal-tables right too).
    standby_secret: str = ""


class ClusterConfig(msgspec.Struct, kw_only=True, frozen=True):
    """An elected cluster's settings, checked (``[cluster]`` with ``zookeeper``)."""

    zookeeper: str
    path: str
    node: str
    advertise: str
    session_timeout_ms: int
    min_insync: int
    replica_lag_ms: int


NODE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
ZK_PATH_RE = re.compile(r"(/[A-Za-z0-9_.-]{1,64}){1,8}")
ZK_HOSTS_RE = re.compile(r"[A-Za-z0-9.:\[\]-]{1,200}(,[A-Za-z0-9.:\[\]-]{1,200}){0,8}")
SESSION_TIMEOUT_MS_RANGE = (1000, 30_000)  # ZooKeeper grants 2..20 ticks: past 30 s it may grant less


def cluster_config(c: ClusterSection, bind: list[str], node_override: str | None = None) -> ClusterConfig | None:
    """The checked cluster settings, or None without ``zookeeper`` (one dispatcher, or
    standbys started by hand)."""
    node = node_override if node_override is not None else c.node
    if not c.zookeeper:
        if node_override is not None:
            raise ConfigError("--node needs a [cluster] block with zookeeper")
        return None
    if not ZK_HOSTS_RE.fullmatch(c.zookeeper):
        raise ConfigError(f"cluster.zookeeper must be host:port[,host:port...], got {c.zookeeper[:80]!r}")
    if not ZK_PATH_RE.fullmatch(c.path) or {".", ".."} & set(c.path.split("/")) or c.path.startswith("/zookeeper"):
        raise ConfigError(f"cluster.path must be a znode path like /zq/orders (letters, digits, _ . -), "
                          f"got {c.path[:80]!r}")
    if not NODE_NAME_RE.fullmatch(node):
        raise ConfigError(f"cluster.node (or --node) must be 1..64 letters, digits, _ . -, got {node[:80]!r}")
    advertise = c.advertise or bind[0]
    if not advertise.startswith("tcp://") or "*" in advertise or len(advertise) > 200:
        raise ConfigError(f"cluster.advertise must be a tcp:// endpoint other nodes and clients can reach "
                          f"(the first bind is {bind[0]!r}), got {advertise[:80]!r}")
    timeout = duration_ms(c.session_timeout, "cluster.session_timeout")
    lo, hi = SESSION_TIMEOUT_MS_RANGE
    if not lo <= timeout <= hi:
        raise ConfigError(f"cluster.session_timeout must be {lo // 1000}s..{hi // 1000}s")
    lag = duration_ms(c.replica_lag, "cluster.replica_lag")
    if not 100 <= lag <= 600_000:
        raise ConfigError("cluster.replica_lag must be 100ms..10m")
    if not 0 <= c.min_insync <= REPLICAS_ACK_MAX:
        raise ConfigError(f"cluster.min_insync must be 0..{REPLICAS_ACK_MAX}, got {c.min_insync}")
    return ClusterConfig(zookeeper=c.zookeeper, path=c.path, node=node, advertise=advertise,
                         session_timeout_ms=timeout, min_insync=c.min_insync, replica_lag_ms=lag)


STANDBY_SECRET_CHARS = (16, 1024)


def check_standby_secret(c: ClusterSection, secured: bool, replicas_ack: int) -> None:
    """A standby's position releases confirmations, so the leader must be able to tell a
    standby from any client: in a cluster ZooKeeper vouches for its nodes
    (``zq.server.trust``); a lone leader needs ``[security]`` or ``standby_secret``."""
    secret = c.standby_secret
    lo, hi = STANDBY_SECRET_CHARS
    if secret and not (lo <= len(secret) <= hi and secret.isascii() and secret.isprintable()):
        raise ConfigError(f"cluster.standby_secret must be {lo}..{hi} printable ASCII characters "
                          "(e.g. python -c 'import secrets; print(secrets.token_hex(16))')")
    if replicas_ack and not c.zookeeper and not secured and not secret:
        raise ConfigError("cluster.replicas_ack without [security] needs cluster.standby_secret (given to "
                          "`zq standby` as $ZQ_STANDBY_SECRET): otherwise any client that sends BOUNDS would "
                          "count as a standby and release confirmations nothing holds")


class FileConfig(msgspec.Struct, forbid_unknown_fields=True):
    server: ServerSection = msgspec.field(default_factory=ServerSection)
    cluster: ClusterSection = msgspec.field(default_factory=ClusterSection)
    queue: list[QueueSection] = msgspec.field(default_factory=list)
    security: SecuritySection | None = None


class Config(msgspec.Struct, kw_only=True):
    """The resolved configuration: integers with units in the names."""

    data: str = DEFAULT_DATA
    bind: list[str] = msgspec.field(default_factory=lambda: [DEFAULT_ENDPOINT])
    durability: str = "batch"
    fsync_interval_ms: int = 1000
    auto_queues: bool = True
    heartbeat_ms: int = 1000
    heartbeat_liveness: int = 3
    retention_ms: int = 7 * 86_400_000
    max_message_bytes: int = limits.MESSAGE_BYTES_MAX
    metrics: str | None = None
    max_connections: int = limits.CONNECTIONS_DEFAULT
    max_subscriptions_per_connection: int = limits.SUBSCRIPTIONS_PER_CONNECTION_DEFAULT
    max_replays_per_connection: int = 64
    max_replays: int = 1024
    max_range_requests: int = 64
    max_unread_bytes: int = limits.UNREAD_BYTES_DEFAULT
    max_unread_total_bytes: int = limits.UNREAD_TOTAL_BYTES_DEFAULT
    expr_limits: ExprLimits = DEFAULT_LIMITS  # for expressions clients send
    queues: list[QueueSettings] = msgspec.field(default_factory=list)
    security: SecuritySection | None = None  # CurveZMQ (zq.server.security); None: plaintext, loopback advised
    replicas_ack: int = 0  # [cluster]: confirmations wait for this many standbys (zq.server.standby)
    cluster: ClusterConfig | None = None  # [cluster] with zookeeper: an elected node (zq.server.cluster)
    cluster_section: ClusterSection = msgspec.field(default_factory=ClusterSection)  # as written (for --node)

    @classmethod
    def load(cls, path: str | Path) -> "Config":
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))  # (TOML is UTF-8, whatever the locale)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        except (OSError, UnicodeError) as exc:  # a directory, no permission, a file cut in mid-character
            raise ConfigError(f"config file {path} cannot be read: {exc}") from None
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "Config":
        base = Path(source).parent if source != "config" else Path.cwd()  # relative key paths start here
        try:
            fc = msgspec.convert(raw, FileConfig)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{source}: {explain(exc)}") from None
        try:
            return cls.checked(fc, base, source)
        except ConfigError as exc:
            text = str(exc)
            raise ConfigError(text if text.startswith(f"{source}:") else f"{source}: {text}") from None

    @classmethod
    def checked(cls, fc: FileConfig, base: Path, source: str) -> "Config":
        s = fc.server
        if s.durability not in ("fsync", "batch", "none"):
            raise ConfigError(f"{source}: server.durability must be fsync, batch or none, got {s.durability!r}")
        if not s.bind:
            raise ConfigError(f"{source}: server.bind needs at least one endpoint")
        cfg = cls(
            data=s.data,
            bind=list(s.bind),
            durability=s.durability,
            fsync_interval_ms=duration_ms(s.fsync_interval, "server.fsync_interval"),
            auto_queues=s.auto_queues,
            heartbeat_ms=duration_ms(s.heartbeat, "server.heartbeat"),
            heartbeat_liveness=s.heartbeat_liveness,
            retention_ms=duration_ms(s.retention, "server.retention"),
            max_message_bytes=size_bytes(s.max_message_size, "server.max_message_size"),
            metrics=s.metrics,
            max_connections=s.max_connections,
            max_subscriptions_per_connection=s.max_subscriptions_per_connection,
            max_replays_per_connection=s.max_replays_per_connection,
            max_replays=s.max_replays,
            max_range_requests=s.max_range_requests,
            max_unread_bytes=size_bytes(s.max_unread, "server.max_unread"),
            max_unread_total_bytes=size_bytes(s.max_unread_total, "server.max_unread_total"),
            expr_limits=ExprLimits(s.max_filter_chars, s.max_filter_depth, s.max_filter_in_items),
            queues=[queue_settings(q, f"queue[{i}]") for i, q in enumerate(fc.queue)],
            security=check_section(fc.security, base) if fc.security is not None else None,
            replicas_ack=fc.cluster.replicas_ack,
            cluster_section=fc.cluster,
        )
        if fc.cluster.node or not fc.cluster.zookeeper:  # else `zq serve --node` names it (checked then)
            cfg.cluster = cluster_config(fc.cluster, cfg.bind)
        if not 0 <= cfg.replicas_ack <= REPLICAS_ACK_MAX:
            raise ConfigError(f"{source}: cluster.replicas_ack must be 0..{REPLICAS_ACK_MAX}, got {cfg.replicas_ack}")
        check_standby_secret(fc.cluster, cfg.security is not None, cfg.replicas_ack)
        names = [q.name for q in cfg.queues]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"{source}: queue names must be unique, repeated: {dupes}")
        if cfg.heartbeat_ms <= 0 or cfg.heartbeat_liveness < 2:
            raise ConfigError(f"{source}: server.heartbeat must be positive and heartbeat_liveness at least 2")
        if not 1 <= cfg.max_connections <= limits.CONNECTIONS_MAX:
            raise ConfigError(f"{source}: server.max_connections must be 1..{limits.CONNECTIONS_MAX}")
        if not 1 <= cfg.max_subscriptions_per_connection <= limits.SUBSCRIPTIONS_MAX:
            raise ConfigError(f"{source}: server.max_subscriptions_per_connection must be 1..{limits.SUBSCRIPTIONS_MAX}")
        for key in ("max_replays_per_connection", "max_replays", "max_range_requests"):
            if not 1 <= getattr(cfg, key) <= 1_000_000:
                raise ConfigError(f"{source}: server.{key} must be 1..1000000")
        cfg.expr_limits.check(f"{source}: server.max_filter_")
        if not limits.UNREAD_BYTES_MIN <= cfg.max_unread_bytes <= limits.UNREAD_BYTES_MAX:
            raise ConfigError(f"{source}: server.max_unread must be {limits.UNREAD_BYTES_MIN >> 20}MiB.."
                              f"{limits.UNREAD_BYTES_MAX >> 30}GiB, got {cfg.max_unread_bytes}B")
        if not limits.UNREAD_BYTES_MIN <= cfg.max_unread_total_bytes <= limits.UNREAD_BYTES_MAX:
            raise ConfigError(f"{source}: server.max_unread_total must be {limits.UNREAD_BYTES_MIN >> 20}MiB.."
                              f"{limits.UNREAD_BYTES_MAX >> 30}GiB, got {cfg.max_unread_total_bytes}B")
        if not 0 < cfg.max_message_bytes <= limits.MESSAGE_BYTES_MAX:
            raise ConfigError(f"{source}: server.max_message_size must be 1B..{limits.MESSAGE_BYTES_MAX}B")
        return cfg


# Config keys with units -> (QueueSettings field, converter); a falsy value means 0 (none).
_CONVERTED = {
    "lease": ("lease_ms", duration_ms),
    "expiration": ("expiration_ms", duration_ms),
    "dedup_window": ("dedup_window_ms", duration_ms),
    "max_lease_age": ("max_lease_age_ms", duration_ms),
    "max_bytes": ("max_bytes", size_bytes),
}


CONVERTED_KEYS = {key: name for key, (name, _) in _CONVERTED.items()}


def setting_of(key: str, value: Any, name: str, topics: str | None, where: str) -> tuple[str, Any]:
    """One ``[[queue]]`` key's value as its settings field: units converted, ``backoff``
    and ``dead_letter`` left out (None) as the defaults every queue shares."""
    if key in _CONVERTED:
        field, convert = _CONVERTED[key]
        return field, convert(value, f"{where}.{key}") if value else 0
    if key == "backoff":
        if value is None:
            return "backoff_ms", list(DEFAULT_BACKOFF_MS)
        if type(value) is not list or len(value) > limits.BACKOFF_STEPS_MAX:
            raise ConfigError(f"{where}.backoff: a list of at most {limits.BACKOFF_STEPS_MAX} durations")
        return "backoff_ms", [duration_ms(v, f"{where}.backoff[{i}]") for i, v in enumerate(value)]
    if key == "dead_letter":
        return key, default_dead_letter(name, topics) if value is None else value or None
    if key == "group_header":
        return key, value or None
    return key, value


def setting_changes(args: dict[str, Any], current: QueueSettings, where: str) -> dict[str, Any]:
    """``queue-alter``'s config keys (``lease = "5s"``; None: back to the default) as
    settings fields, read against the queue's own settings (its topics decide the
    default dead letter). The engine checks the result whole (``alter_queue``)."""
    out: dict[str, Any] = {}
    defaults = {f.name: f.default for f in msgspec.structs.fields(QueueSettings)}
    for key, value in args.items():
        if value is None and key not in ("backoff", "dead_letter"):
            field = CONVERTED_KEYS.get(key, key)
            out[field] = defaults[field]
        else:
            field, out_value = setting_of(key, value, current.name, current.topics, where)
            out[field] = out_value
    try:  # types, as the config file's are checked (a string where a count goes...)
        msgspec.convert({**msgspec.to_builtins(current), **out}, type=QueueSettings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return out


def queue_settings(q: QueueSection, where: str) -> QueueSettings:
    if q.topics is not None:
        try:
            compile_pattern(q.topics)
        except PatternError as exc:
            raise ConfigError(f"{where}.topics: {q.topics[:80]!r}: {exc}") from None
    kwargs: dict[str, Any] = dict(setting_of(key, getattr(q, key), q.name, q.topics, where)
                                  for key in QueueSection.__struct_fields__)
    settings = QueueSettings(**kwargs)
    try:
        return settings.validate()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
