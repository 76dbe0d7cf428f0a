"""Every bound zq enforces, in one place, with the relations between them asserted.

TigerStyle: put a limit on everything. These are defaults; the config may lower or
raise the ones marked as configurable, within the hard maxima here.
"""

MESSAGE_BYTES_MAX = 16 * 1024 * 1024  # configurable: server.max_message_size
HEADERS_MAX = 64  # header pairs per message
HEADER_BYTES_MAX = 4096  # one header key or value
TOPIC_BYTES_MAX = 480  # also a queue's name: LMDB keys hold at most 511 bytes ("rp:" + name + ".dead")
NAME_BYTES_MAX = 128  # a subscription, claim or replay id chosen by a client
QUEUES_MAX = 10_000  # queues in one dispatcher, declared and auto-created
DURATION_MS_MAX = 100 * 365 * 86_400_000  # any duration (lease, expiration, dedup window, extension): 100 years
ERROR_TEXT_MAX = 1024  # a failed cancel's error string (characters)
BACKOFF_STEPS_MAX = 32  # steps of a queue's retry schedule (backoff)
TENANT_WEIGHTS_MAX = 10_000  # entries of a queue's tenant_weights
TENANT_WEIGHT_MAX = 1000  # one tenant's weight (the lightest gets at least 1/1000 of the heaviest's share)
PRIORITY_AGING_MAX = 1_000_000_000  # messages of waiting one priority level is worth
TENANTS_TRACKED_SOFT = 4096  # a fair queue forgets tenants with nothing ahead of the clock past this many
RECLAIMS_PER_MESSAGE_MAX = 8  # times one message may be taken back unstarted (then it stays where it is)
RECLAIM_SCAN_MAX = 256  # newest deliveries of one holder looked at per reclaim decision
COUNT_MAX = 1 << 53  # any size or count setting (max_depth, max_bytes, target_queue_depth)
BACKLOG_MAX = 65_536  # per subscription
GROUPS_PER_QUEUE_MAX = 10_000_000  # configurable per queue: max_groups
SUBSCRIPTIONS_MAX = 100_000
CONNECTIONS_DEFAULT = 10_000  # configurable: server.max_connections (sessions at once)
CONNECTIONS_MAX = 1_000_000
SUBSCRIPTIONS_PER_CONNECTION_DEFAULT = 1_000  # configurable: server.max_subscriptions_per_connection
# Per client key, with [security] (configurable per key: max_sessions, max_subscriptions,
# max_queues): one key cannot take all of what every key shares.
KEY_SESSIONS_DEFAULT = 1_000  # of CONNECTIONS_DEFAULT
KEY_SUBSCRIPTIONS_DEFAULT = 10_000  # of SUBSCRIPTIONS_MAX
KEY_QUEUES_DEFAULT = 1_000  # of QUEUES_MAX
DELIVERIES_MAX = 0xFFFF  # delivery and cancel counters are packed into 16 bits
UNREAD_BYTES_DEFAULT = 64 * 1024 * 1024  # configurable: server.max_unread (bytes sent to one peer, not yet read)
UNREAD_BYTES_MIN = 1024 * 1024
RANGES_WAITING_PER_CONNECTION = 4  # RANGE requests of one connection being answered at once (each up to ~16 MiB)
UNREAD_BYTES_MAX = 64 * 1024 * 1024 * 1024
UNREAD_TOTAL_BYTES_DEFAULT = 1024 * 1024 * 1024  # configurable: server.max_unread_total (all peers together)
PUBLISH_BATCH_MAX = 4096  # messages in one publish frame
FRAME_BYTES_MAX = 64 * 1024 * 1024  # transport cap: bigger frames close the connection (libzmq)
PUBLISH_BATCH_BYTES = 8 * 1024 * 1024  # clients split publish batches at about this many bytes
FRAME_SLACK_BYTES = 1024 * 1024  # a frame's room beyond its messages (headers of 64 x 4 KiB pairs: 512 KiB)
ACK_BATCH_MAX = 65_536  # bookmarks in one ack frame
DELIVER_BATCH_MAX = 256  # messages in one deliver frame
DELIVER_FRAME_BYTES = 1024 * 1024  # ... and about this many bytes (one message may be more)
RECOVERY_POINT_INTERVAL_MS = 1000  # how often queue recovery points are journaled
RECOVERY_POINT_REFRESH_MS = 60_000  # an idle queue's recovery point is rewritten at least this often
EXPIRY_SWEEP_INTERVAL_MS = 1000  # how often parked/returned messages are checked for age
CLAIM_MAX = 4096  # messages one claim may take
CLAIM_WAIT_MS_MAX = 60_000  # a claim's long poll (longer: refused, in the client and the server)
DEAD_REMEMBERED = 16_384  # per queue: recently dead-lettered bookmarks a late settle is told about ("dead")
DISPATCH_MATCHES_PER_STEP = 5_000  # filter evaluations of one engine step (all queues): ~1-6 us each; more waits a step
VIEW_SCAN_MAX = 10_000  # messages one peek / query reads: 4-6 us each with a filter (a 1 M-frame fuzz saw 25,000 take 100-160 ms)
BULK_SLICE = 10_000  # messages a bulk operator action (purge, move, ack-filter, redrive) reads per loop iteration
BULK_COPY_SLICE = 2_000  # messages a move or redrive copies per loop iteration (~12 us each with the journal write)
BULK_ACTIONS_MAX = 16  # bulk operator actions running at once

assert BACKLOG_MAX <= ACK_BATCH_MAX
assert KEY_SESSIONS_DEFAULT < CONNECTIONS_DEFAULT and KEY_SUBSCRIPTIONS_DEFAULT < SUBSCRIPTIONS_MAX
assert KEY_QUEUES_DEFAULT < QUEUES_MAX
assert len(b"rp:") + TOPIC_BYTES_MAX + len(b".dead") <= 511  # LMDB's largest key
assert MESSAGE_BYTES_MAX < FRAME_BYTES_MAX // 2  # an oversized message still gets an error reply
assert DELIVERIES_MAX < 1 << 16


def frame_bytes_max(message_bytes: int) -> int:
    """The largest frame a dispatcher reads (libzmq's MAXMSGSIZE; bigger ones close the
    connection before a byte is kept): twice what a zq client puts in one frame (a batch
    of PUBLISH_BATCH_BYTES plus one message), so that a frame up to twice the message
    limit still gets an error naming it. 33 MiB at the defaults; it was a flat 64 MiB,
    and three 48 MiB frames (each copied a few times on its way to the journal) grew the
    server by 290 MiB."""
    return min(FRAME_BYTES_MAX, 2 * max(message_bytes, PUBLISH_BATCH_BYTES) + FRAME_SLACK_BYTES)
# Queues listed in one STATS answer (``server.queues`` counts them all): the busiest, or
# those the request names. Every queue's figures cost ~20 us; 10,000 queues made every
# STATS hold the loop ~250 ms, and its answer ~6 MB.
STATS_QUEUES_MAX = 1_000
