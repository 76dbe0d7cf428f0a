"""Per-queue settings as the engine sees them: plain integers, units in the names.

The TOML config (``zq.server.config``) parses strings such as ``"30s"`` into these; the
engine never sees a string duration.
"""

from __future__ import annotations

import msgspec

from zq.core import limits
from zq.core.errors import ConfigError, LimitError, ProtocolError
from zq.core.expr import ExprError, compile_filter, compile_value
from zq.core.regex import PatternError, compile_pattern

SEMANTICS = ("at-least-once", "at-most-once")
FAIRNESS = ("fast", "round-robin", "proportional")
GROUP_POLICIES = ("sequenced", "exclusive", "one-in-flight")
OVERFLOW_POLICIES = ("reject", "ring", "flow-control")


def check_topic(topic: str, what: str = "topic") -> None:
    if not topic:
        raise ProtocolError(f"{what} must not be empty")
    if len(topic) > limits.TOPIC_BYTES_MAX or len(topic.encode()) > limits.TOPIC_BYTES_MAX:
        raise LimitError(f"{what} longer than {limits.TOPIC_BYTES_MAX} bytes")


def check_queue_name(name: str) -> None:
    """A queue's name becomes a journal key: refuse what LMDB could not store."""
    check_topic(name, "queue name")



DEDUP_WINDOW_MS_DEFAULT = 86_400_000  # also the window of topics no queue covers (auto_queues = false)


class QueueSettings(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    topics: str | None = None  # regex over topic names; None means exactly ``name``
    publish_to: str | None = None  # publishing to the queue's name goes to this topic
    semantics: str = "at-least-once"
    fairness: str | None = None  # None: proportional (at-least-once), round-robin (at-most-once)
    lease_ms: int = 30_000
    max_per_subscription_backlog: int = 100
    max_cancels: int = 0  # 0 = unlimited
    max_deliveries: int = 20  # 0 = unlimited
    expiration_ms: int = 0  # 0 = never
    dead_letter: str | None = None
    group_header: str | None = "group"  # header holding the group id; None: never grouped
    group_policy: str = "sequenced"
    max_groups: int = limits.GROUPS_PER_QUEUE_MAX
    allow_ack_unleased: bool = False  # may a subscriber ack an available (unleased) message?
    start_seq: int = 0  # journal position the queue starts from when first declared
    filter: str | None = None  # expression: which messages of the topics enter the queue
    browse_only: bool = False  # every subscriber sees every message; none leaves by acks
    barrier: str | None = None  # expression: matching messages are barriers (see the protocol spec)
    lvq_key: str | None = None  # last-value queue: a header name or /body/path; a newer message replaces
    priority: str | None = None  # expression: higher goes first (unsigned 64-bit; missing = 0)
    sort_key: str | None = None  # header or /body/path: delivery in ascending order of it
    target_queue_depth: int = 0  # only this many messages in memory; the rest read from the journal (0: all)
    max_depth: int = 0  # messages in the queue (waiting + leased); 0: no limit
    max_bytes: int = 0  # their payload bytes; 0: no limit
    overflow: str = "reject"  # at a limit: "reject" | "ring" (drop the oldest available) | "flow-control"
    resume_percent: int = 90  # flow-control: confirmations flow again below this % of the limits
    leasing: str = "strict"  # "shared": ack-by-filter may also take leased messages
    dedup_window_ms: int = DEDUP_WINDOW_MS_DEFAULT  # a message id seen this recently on the topic enqueues nothing (0: off)
    # Retry schedule: after its n-th delivery is cancelled or its lease expires, a message
    # waits backoff_ms[n-1] (the last entry from then on) before it goes again; [] = at once.
    backoff_ms: list[int] = []
    backoff_jitter: float = 0.1  # each wait is spread by up to this fraction either way
    # Session-wide lease renewal: a lease whose holder is still connected (heartbeating)
    # is renewed when it ends, until the delivery is this old; 0 = off (leases just end).
    max_lease_age_ms: int = 0
    # Per-cause delivery limits (0: none): cancels naming an error, lease expiries, and
    # deliveries whose consumer went away (or the dispatcher died) while holding it.
    max_failures: int = 0
    max_lease_expiries: int = 0
    max_consumer_gone: int = 0
    # Two-level fairness (zq.core.fairshare): waiting messages are shared out between
    # tenants (named by this header; missing = the tenant "") by weight, and ``priority``
    # ages: each level counts as ``priority_aging`` messages of waiting (0: strict).
    tenant_header: str | None = None
    tenant_weights: dict[str, int] = {}
    tenant_default_weight: int = 1
    priority_aging: int = 0

    def fair(self) -> bool:
        """Is the queue's order a fair share (tenants, or priority that ages)?"""
        return bool(self.tenant_header) or self.priority_aging > 0

    def effective_fairness(self) -> str:
        if self.fairness is not None:
            return self.fairness
        return "proportional" if self.semantics == "at-least-once" else "round-robin"

    def validate_kind(self, where: str) -> None:
        """Refuse combinations of queue kinds whose meanings contradict each other."""
        if self.priority and self.sort_key:
            raise ConfigError(f"{where}: a queue has one order: set priority or sort_key, not both")
        ordered = ("priority" if self.priority else "sort_key" if self.sort_key else
                   "tenant_header" if self.tenant_header else None)
        if self.tenant_header and self.sort_key:
            raise ConfigError(f"{where}: tenant_header cannot be combined with sort_key: a sorted queue's order "
                              "is its key, and a fair share decides the order between tenants")
        if self.priority_aging and not self.priority:
            raise ConfigError(f"{where}: priority_aging ages priorities: set priority too")
        if ordered and self.barrier:
            raise ConfigError(f"{where}: {ordered} cannot be combined with barrier: a barrier waits for every "
                              "earlier message, and an ordered queue has no single 'earlier'")
        if ordered and self.browse_only:
            raise ConfigError(f"{where}: {ordered} cannot be combined with browse_only: browsers walk the queue "
                              "in publish order from their own cursors")
        if ordered and self.max_depth + self.max_bytes and self.overflow == "ring":
            raise ConfigError(f"{where}: {ordered} cannot be combined with overflow = 'ring': ring drops the "
                              "oldest message, which an ordered queue keeps anywhere in its heap; "
                              "use 'reject' or 'flow-control'")
        if self.target_queue_depth < 0:
            raise ConfigError(f"{where}: target_queue_depth must not be negative")
        if self.target_queue_depth:
            for key, why in (("priority", "the highest priority may be any message still in the journal"),
                             ("tenant_header", "the next tenant's message may be any message still in the journal"),
                             ("sort_key", "the lowest key may be any message still in the journal"),
                             ("barrier", "a barrier waits for messages that may still be in the journal"),
                             ("lvq_key", "a new value must replace messages that may still be in the journal"),
                             ("browse_only", "browsers never drain the active part, so nothing more is read in"),
                             ("max_bytes", "the bytes of messages still in the journal are not tracked")):
                if getattr(self, key):
                    raise ConfigError(f"{where}: target_queue_depth cannot be combined with {key}: "
                                      f"only the first messages are in memory, and {why}")

    def validate(self) -> "QueueSettings":
        """Raise ConfigError naming the offending key; return self for chaining."""
        where = f"queue {self.name[:80]!r}"
        try:
            check_queue_name(self.name)
            for key in ("dead_letter", "publish_to"):
                if getattr(self, key) is not None:
                    check_topic(getattr(self, key), key)
        except (LimitError, ProtocolError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if self.topics is not None:
            try:
                compile_pattern(self.topics)
            except PatternError as exc:
                raise ConfigError(f"{where}: topics: {exc}") from None
        if self.group_header is not None and not 0 < len(self.group_header) <= limits.HEADER_BYTES_MAX:
            raise ConfigError(f"{where}: group_header must be 1..{limits.HEADER_BYTES_MAX} characters")
        for key in ("lease_ms", "expiration_ms", "dedup_window_ms", "max_lease_age_ms"):
            if getattr(self, key) > limits.DURATION_MS_MAX:
                raise ConfigError(f"{where}: {key.removesuffix('_ms')} longer than 100 years")
        for key in ("max_depth", "max_bytes", "target_queue_depth", "start_seq"):
            if not 0 <= getattr(self, key) <= limits.COUNT_MAX:
                raise ConfigError(f"{where}: {key} must be 0..2**53")
        if self.semantics not in SEMANTICS:
            raise ConfigError(f"{where}: semantics must be one of {SEMANTICS}, got {self.semantics!r}")
        fairness = self.effective_fairness()
        if fairness not in FAIRNESS:
            raise ConfigError(f"{where}: fairness must be one of {FAIRNESS}, got {fairness!r}")
        if self.semantics == "at-most-once" and fairness != "round-robin":
            raise ConfigError(f"{where}: at-most-once queues support fairness 'round-robin' only, got {fairness!r}")
        if self.group_policy not in GROUP_POLICIES:
            raise ConfigError(f"{where}: group_policy must be one of {GROUP_POLICIES}, got {self.group_policy!r}")
        if self.lease_ms <= 0:
            raise ConfigError(f"{where}: lease must be positive")
        if not 1 <= self.max_per_subscription_backlog <= limits.BACKLOG_MAX:
            raise ConfigError(f"{where}: max_per_subscription_backlog must be 1..{limits.BACKLOG_MAX}")
        for key in ("max_cancels", "max_deliveries", "max_failures", "max_lease_expiries", "max_consumer_gone"):
            if not 0 <= getattr(self, key) <= limits.DELIVERIES_MAX:
                raise ConfigError(f"{where}: {key} must be 0..{limits.DELIVERIES_MAX}")
        if self.browse_only and (self.semantics != "at-least-once" or self.barrier):
            raise ConfigError(f"{where}: browse_only queues are at-least-once and take no barrier")
        self.validate_kind(where)
        for key, compile_ in (("filter", compile_filter), ("barrier", compile_filter), ("lvq_key", compile_value),
                              ("priority", compile_value), ("sort_key", compile_value)):
            text = getattr(self, key)
            if text is not None:
                try:
                    compile_(text)
                except ExprError as e:
                    raise ConfigError(f"{where}: {key}: {e}") from None
        if self.overflow not in OVERFLOW_POLICIES:
            raise ConfigError(f"{where}: overflow must be one of {OVERFLOW_POLICIES}, got {self.overflow!r}")
        if self.max_depth < 0 or self.max_bytes < 0:
            raise ConfigError(f"{where}: max_depth and max_bytes must not be negative")
        if not 1 <= self.resume_percent <= 100:
            raise ConfigError(f"{where}: resume_percent must be 1..100")
        if self.leasing not in ("strict", "shared"):
            raise ConfigError(f"{where}: leasing must be 'strict' or 'shared', got {self.leasing!r}")
        if self.max_lease_age_ms < 0:
            raise ConfigError(f"{where}: max_lease_age must not be negative")
        if self.max_lease_age_ms and self.max_lease_age_ms < self.lease_ms:
            raise ConfigError(f"{where}: max_lease_age ({self.max_lease_age_ms} ms) is shorter than the lease "
                              f"({self.lease_ms} ms): a delivery could not even keep its first lease")
        if self.max_lease_age_ms and self.semantics == "at-most-once":
            raise ConfigError(f"{where}: max_lease_age renews leases, and at-most-once queues lease nothing")
        if self.dedup_window_ms < 0:
            raise ConfigError(f"{where}: dedup_window must not be negative")
        if self.expiration_ms < 0:
            raise ConfigError(f"{where}: expiration must not be negative")
        if len(self.backoff_ms) > limits.BACKOFF_STEPS_MAX:
            raise ConfigError(f"{where}: backoff has at most {limits.BACKOFF_STEPS_MAX} steps")
        for ms in self.backoff_ms:
            if type(ms) is not int or not 0 <= ms <= limits.DURATION_MS_MAX:
                raise ConfigError(f"{where}: each backoff step must be 0..100 years")
        if not 0.0 <= self.backoff_jitter <= 1.0:  # NaN fails too
            raise ConfigError(f"{where}: backoff_jitter must be 0..1, got {self.backoff_jitter!r}")
        self.validate_fairness(where)
        if not 1 <= self.max_groups <= 1 << 31:
            raise ConfigError(f"{where}: max_groups must be 1..2**31")
        return self

    def validate_fairness(self, where: str) -> None:
        if self.tenant_header is not None and not 0 < len(self.tenant_header) <= limits.HEADER_BYTES_MAX:
            raise ConfigError(f"{where}: tenant_header must be 1..{limits.HEADER_BYTES_MAX} characters")
        if type(self.tenant_weights) is not dict or len(self.tenant_weights) > limits.TENANT_WEIGHTS_MAX:
            raise ConfigError(f"{where}: tenant_weights is a table of at most {limits.TENANT_WEIGHTS_MAX} tenants")
        for tenant, weight in [("(default)", self.tenant_default_weight), *self.tenant_weights.items()]:
            if type(tenant) is not str or len(tenant) > limits.HEADER_BYTES_MAX:
                raise ConfigError(f"{where}: a tenant's name is a string of at most {limits.HEADER_BYTES_MAX} "
                                  "characters")
            if type(weight) is not int or not 1 <= weight <= limits.TENANT_WEIGHT_MAX:
                raise ConfigError(f"{where}: tenant {tenant[:80]!r}: a weight is a whole number "
                                  f"1..{limits.TENANT_WEIGHT_MAX}, got {weight!r}")
        if (self.tenant_weights or self.tenant_default_weight != 1) and not self.tenant_header:
            raise ConfigError(f"{where}: tenant weights need tenant_header (the header naming a message's tenant)")
        if type(self.priority_aging) is not int or not 0 <= self.priority_aging <= limits.PRIORITY_AGING_MAX:
            raise ConfigError(f"{where}: priority_aging must be a whole number 0..{limits.PRIORITY_AGING_MAX}")


def covers_topic(settings: QueueSettings, topic: str) -> bool:
    """Would a queue of these settings take ``topic`` (``Queue.covers`` before it exists)?"""
    if settings.topics is None:
        return topic == settings.name
    return compile_pattern(settings.topics).fullmatch(topic) is not None


# One set of defaults for every queue zq.toml or a declare makes without saying, and for
# auto-created ones: a failing message waits before each retry (a worker that fails at
# once does not burn its 20 deliveries in a second), and its dead letter is kept.
DEFAULT_BACKOFF_MS = [1_000, 5_000, 30_000, 60_000, 300_000]
DEAD_SUFFIX = ".dead"


def default_dead_letter(name: str, topics: str | None = None) -> str | None:
    """``<name>.dead``; none for a dead-letter queue itself (no chains of them), for a
    name too long to take the suffix, or when the queue's own topics would take its
    dead letters back in."""
    target = name + DEAD_SUFFIX
    if name.endswith(DEAD_SUFFIX) or len(target.encode()) > limits.TOPIC_BYTES_MAX:
        return None
    if topics is not None:
        try:
            if compile_pattern(topics).fullmatch(target):
                return None
        except PatternError:
            return None  # (the topics' own error is reported by validate)
    return target


def auto_queue(name: str, start_seq: int, dead_letter: bool = True) -> QueueSettings:
    """The queue created for a name no queue covers (DESIGN: auto-created queues):
    the defaults of every queue (``default_dead_letter``, ``DEFAULT_BACKOFF_MS``)."""
    return QueueSettings(
        name=name,
        dead_letter=default_dead_letter(name) if dead_letter else None,
        backoff_ms=list(DEFAULT_BACKOFF_MS),
        start_seq=start_seq,
    )
