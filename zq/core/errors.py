"""Errors zq reports to its callers.

Operating errors (a peer's bad request, a full disk) are ``ZqError`` subclasses with
a stable ``code`` that travels on the wire; programmer errors stay ``AssertionError``.
"""


class ZqError(Exception):
    """Root of every error zq reports; ``code`` is the wire error code."""

    code = "error"


class ProtocolError(ZqError):
    """A request that breaks the protocol: malformed, out of order, unknown kind."""

    code = "protocol"


class ReservedNameError(ProtocolError):
    """A publish to a queue's name that the queue does not take as a topic: it would reach
    no queue (or, with auto-created queues, redefine that queue), so it is refused."""

    code = "reserved-name"


class QueueExistsError(ProtocolError):
    """A declare names a queue that exists with other settings: the message names each
    difference (a declare with the same settings succeeds, as AMQP's and SQS's do)."""

    code = "exists"


class UnknownQueueError(ZqError):
    code = "unknown-queue"


class UnknownSubscriptionError(ZqError):
    code = "unknown-subscription"


class LimitError(ZqError):
    """A configured ceiling was reached (message size, groups, subscriptions...)."""

    code = "limit"


class QueueFullError(LimitError):
    """A queue with ``overflow = "reject"`` is at its ``max_depth`` / ``max_bytes``."""

    code = "queue-full"


class NotSupportedError(ZqError):
    code = "not-supported"


class NotEntitledError(ZqError):
    """With security on: this client's key may not make this request (``zq.server.security``)."""

    code = "not-entitled"


class ConfigError(ZqError):
    code = "config"


class JournalError(ZqError):
    """The journal cannot do what was asked: disk full, newer format, corruption."""

    code = "journal"


class ConnectionLost(ZqError):
    """No dispatcher answered, the session could not be kept, or an embedded
    dispatcher behind an in-process session stopped."""

    code = "connection"


class NotLeaderError(ZqError):
    """This dispatcher does not lead its cluster (a standby, or a leader deposed by a
    newer epoch); the message names the leader when it is known (``wire.leader_hint``)."""

    code = "not-leader"


class ResumePointError(ZqError):
    """A replay asked to start past the journal's end: a bookmark never written here, or
    one a failover truncated (a deposed leader's unreplicated records). The message
    names the bookmark to resume from."""

    code = "resume-point"
