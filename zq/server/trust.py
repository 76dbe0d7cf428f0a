"""Peers a standby or a leader cannot take at their word.

Any client can send BOUNDS, and a standby's BOUNDS releases confirmations and joins
the in-sync set, so a position counts only when its standby proves who it is:

* In an elected cluster, each node makes a random token when it starts and publishes it
  in ZooKeeper beside its member znode (``proofs/<node>``, ephemeral:
  ``zq.server.election``); its standby (``Standby(proof=...)``) shows the token in every
  BOUNDS, and the leader counts the position only if ZooKeeper lists that node and
  holds that token for it (``LeaderDuty.proven``).
* A hand-started ``zq standby`` of a lone leader shows the leader's ``[cluster]
  standby_secret`` (from ``$ZQ_STANDBY_SECRET``), and with ``[security]`` its key needs
  the admin right ``journal-tables``; a lone leader with ``replicas_ack`` and neither is
  refused at start (``zq.server.config.check_standby_secret``).

What this does not do: without ``[security]`` the token crosses the network in clear,
like everything else, and ZooKeeper shows it to whoever can read it (README, "A cluster":
what a cluster without ``[security]`` exposes).

(A standby's ``not-leader`` answerer, ``zq.server.standby.NotLeader``, survives any
frame: msgspec raises ``UnicodeDecodeError``, not a ``MsgspecError``, for a string that
is not UTF-8, which ended its thread, and with it every answer on that endpoint until
the next failover.)
"""

from __future__ import annotations

import hmac

STANDBY_SECRET_ENV = "ZQ_STANDBY_SECRET"  # `zq standby`: the lone leader's [cluster] standby_secret


def same_secret(expected: str, shown: str) -> bool:
    """Constant-time, and any string (``hmac.compare_digest`` refuses non-ASCII ``str``)."""
    return hmac.compare_digest(expected.encode(), shown.encode(errors="surrogatepass"))
