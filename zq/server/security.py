"""CurveZMQ for zq: who may connect, and what each client key may do.

Theory of operation
-------------------
With a ``[security]`` block the dispatcher's ROUTER is a CURVE server: every
connection is encrypted, and a ZAP handler (pyzmq's ``zmq.auth``, on its own thread)
admits a client only if its public key is in the allowlist, a directory of public
certificates as ``zq keygen`` writes them. A plaintext client, or one whose key is not
listed, never completes the handshake: it gets nothing, not even STATS. Each refusal is
counted (STATS ``server.security.refused``) and logged. The allowlist is read again
when the directory changes (checked every heartbeat) or on SIGHUP.

ZAP hands the dispatcher the client's key as the User-Id of every frame; HELLO binds the
session to it, and every later frame must carry the same key: one from another key
(a peer that took the routing id of a connection that dropped) is not handled under
that session (answered ``no-session``, counted as ``key_mismatch``, and the session,
whose connection is gone, ends). Every command is checked against that key's entitlements:
topics it may publish to, queues it may consume, browse (peek, query, replay, range)
or claim from, and operator actions it may run, each a list of glob patterns. When the
allowlist is read again (or the rules are replaced), sessions whose key is no longer
allowed, or whose entitlements shrank, end (``sessions_ended``): their next frame gets
``no-session``, and a HELLO from a key no longer allowed is refused. A key
with no ``[[security.client]]`` entry gets ``[security.default]`` (everything, unless
narrowed), so the allowlist alone is a working setup. Settles need no entitlement: a
connection can only settle what was leased to its own subscriptions.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.auth
from zmq.utils import z85
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from zq.core import limits
from zq.core.errors import ConfigError, NotEntitledError
from zq.keys import public_key_of

log = logging.getLogger("zq.security")


def key_of(frame: zmq.Frame) -> str | None:
    """The client's CurveZMQ key as ZAP named it: None without security, and on an
    inproc connection, where there is no ZAP (reading it there raised, and ended an
    embedded dispatcher the moment anything in its process connected to ``inproc``)."""
    try:
        key = frame.get("User-Id")
    except zmq.ZMQError:
        return None
    return key if isinstance(key, str) else None


ZAP_DOMAIN = "zq"
ALL = ["*"]


class Rights(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What one client key may do: glob patterns per kind of request."""

    publish: list[str] = msgspec.field(default_factory=lambda: list(ALL))  # topics
    consume: list[str] = msgspec.field(default_factory=lambda: list(ALL))  # queues (SUB)
    browse: list[str] = msgspec.field(default_factory=lambda: list(ALL))  # queues / topics (peek, query, replay, range)
    claim: list[str] = msgspec.field(default_factory=lambda: list(ALL))  # queues
    admin: list[str] = msgspec.field(default_factory=lambda: list(ALL))  # operation names (purge, move, ...)
    # Quotas: what one key may hold of what every key shares (zq.server.quotas).
    max_sessions: int = limits.KEY_SESSIONS_DEFAULT  # sessions at once, all its connections
    max_subscriptions: int = limits.KEY_SUBSCRIPTIONS_DEFAULT  # subscriptions and claims at once, all its sessions
    max_queues: int = limits.KEY_QUEUES_DEFAULT  # queues its frames create (publishes, queue-create, move), this run

    def allows(self, kind: str, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in getattr(self, kind))

    def sees(self, queue: str) -> bool:
        """May this key see the queue in STATS / QUEUES (it may consume or browse it)?"""
        return self.allows("consume", queue) or self.allows("browse", queue)

    def covers(self, other: Rights) -> bool:
        """Does this grant at least every pattern ``other`` grants (a rule change that
        keeps a session's rights, or widens them, need not end it)?"""
        for kind in KINDS:
            mine = set(getattr(self, kind))
            if "*" in mine:
                continue
            if not set(getattr(other, kind)) <= mine:
                return False
        return True

    def everything(self, kind: str) -> bool:
        return "*" in getattr(self, kind)


KINDS = ("publish", "consume", "browse", "claim", "admin")
NO_RIGHTS = Rights(publish=[], consume=[], browse=[], claim=[], admin=[])


class ClientSection(Rights, kw_only=True):
    key: str  # the client's public key (z85, 40 characters) or its public certificate file
    name: str = ""


class SecuritySection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    secret_key: str  # the server's secret certificate (``zq keygen server`` writes server.key_secret)
    allow: str  # directory of allowed clients' public certificates (*.key)
    default: Rights = msgspec.field(default_factory=Rights)
    client: list[ClientSection] = msgspec.field(default_factory=list)


def check_section(sec: SecuritySection, base: Path) -> SecuritySection:
    """Resolve paths against the config file's directory and check them now, at start."""
    secret = str((base / sec.secret_key).resolve())
    # Absolute, its links kept: an allowlist swapped by its link (``ln -sfn v2 current``)
    # is read where the link points at each reload, not where it pointed at start.
    allow = os.path.normpath(os.path.join(base, sec.allow))
    try:
        public, secret_key = zmq.auth.load_certificate(secret)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"security.secret_key: cannot read {secret}: {exc}") from None
    if not secret_key:
        raise ConfigError(f"security.secret_key: {secret} holds no secret key (use the .key_secret file)")
    warn_if_exposed(secret)
    if not os.path.isdir(allow):
        raise ConfigError(f"security.allow: {allow} is not a directory of public certificates")
    check_quotas(sec.default, "security.default")
    clients = []
    for i, c in enumerate(sec.client):
        key = c.key if len(c.key) == 40 else str((base / c.key).resolve())
        public_key_of(key, f"security.client[{i}].key")
        check_quotas(c, f"security.client[{i}]")
        clients.append(msgspec.structs.replace(c, key=key))
    return msgspec.structs.replace(sec, secret_key=secret, allow=allow, client=clients)


QUOTA_RANGES = {"max_sessions": limits.CONNECTIONS_MAX, "max_subscriptions": limits.SUBSCRIPTIONS_MAX,
                "max_queues": limits.QUEUES_MAX}


def check_quotas(rights: Rights, where: str) -> None:
    for name, most in QUOTA_RANGES.items():
        value = getattr(rights, name)
        if not 1 <= value <= most:
            raise ConfigError(f"{where}.{name} must be 1..{most:,}, got {value}")


def warn_if_exposed(secret: str) -> str:
    """A secret key others can read is one anyone on the machine can serve as this
    dispatcher with: said loudly at start (not refused: a deployment's own access
    rules, e.g. a group of operators, may be deliberate). Returns the warning ('' if none)."""
    try:
        mode = os.stat(secret).st_mode & 0o777
    except OSError:
        return ""
    if not mode & 0o077:
        return ""
    who = " and ".join(w for w, bits in (("its group", 0o070), ("every user", 0o007)) if mode & bits)
    warning = (f"security.secret_key {secret} is open to {who} (mode {mode:04o}): anyone who reads it can pose as "
               f"this dispatcher to its clients; make it the owner's alone: chmod 600 {secret}")
    log.warning("%s", warning)
    return warning


class _LoggingAuthenticator(ThreadAuthenticator):
    """pyzmq's ZAP handler, logging why it refuses a key."""

    def _send_zap_reply(self, request_id: bytes, status_code: bytes, status_text: bytes,
                        user_id: str = "anonymous") -> None:
        if status_code != b"200":
            log.warning("refused a client key: %s", status_text.decode(errors="replace"))
        super()._send_zap_reply(request_id, status_code, status_text, user_id)


ZAP_BIND_WAIT_S = 2.0  # how long a new ZAP handler waits for the last one's endpoint to be released


CERTIFICATE_BYTES_MAX = 64 * 1024  # a public key certificate is a few hundred bytes


def is_key_name(name: str) -> bool:
    """An allowlist file read for a key: ``*.key``, not hidden (as pyzmq's glob, so no
    ``.key_secret`` file and no editor's or copier's hidden temporary)."""
    return name.endswith(".key") and not name.startswith(".")


def entry_stamp(entry: os.DirEntry) -> tuple[int, int]:
    """What a change of this allowlist entry changes: its target's time and size (a
    link swapped to a new file counts), or the link's own when it leads nowhere (a
    dangling link must not hide every later change of the directory)."""
    try:
        st = entry.stat()
    except OSError:
        st = entry.stat(follow_symlinks=False)
    return st.st_mtime_ns, st.st_size


def is_public_key(text: bytes | None) -> bool:
    """A CURVE public key as certificates write it: 40 characters of Z85, 32 bytes."""
    if not text or len(text) != 40:
        return False
    try:
        return len(z85.decode(text)) == 32
    except Exception:  # (z85.decode: KeyError outside its alphabet, struct.error past 2**32, ValueError ...)
        return False


def start_authenticator(ctx: zmq.Context) -> _LoggingAuthenticator:
    """The context's ZAP handler, started. Its endpoint (``inproc://zeromq.zap.01``) is
    one per context, and a handler stopped just before (a dispatcher closed, another
    started in the same process) releases it only when libzmq's reaper thread has closed
    its socket, later, once a CURVE socket has used it: a bind then fails "Address
    already in use" (one test in 300 in a row here; 195 of 300 with a peer connected).
    Tried again for ``ZAP_BIND_WAIT_S``; past it, another live handler holds it."""
    deadline = time.monotonic() + ZAP_BIND_WAIT_S
    while True:
        auth = _LoggingAuthenticator(ctx)
        try:
            auth.start()
            return auth
        except zmq.ZMQError as exc:
            auth.stop()  # (closes what the failed start opened)
            if exc.errno != zmq.EADDRINUSE:
                raise
            if time.monotonic() >= deadline:
                raise ConfigError("this ZeroMQ context's ZAP handler (inproc://zeromq.zap.01) is held by another "
                                  "dispatcher with [security] in this process: give each its own zmq.Context") from None
        time.sleep(0.01)


HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class Security:
    """The server side: CURVE on the ROUTER, the ZAP thread, entitlements per key."""

    def __init__(self, section: SecuritySection, ctx: zmq.Context) -> None:
        self.section = section
        self.public, self.secret = zmq.auth.load_certificate(section.secret_key)
        self.rules: dict[bytes, Rights] = {public_key_of(c.key, "security.client"): c for c in section.client}
        self.auth = start_authenticator(ctx)
        self.refused = 0  # handshakes that failed: plaintext peers, unknown keys, bad CURVE
        self.key_mismatch = 0  # frames whose key is not the one their session was opened with
        self.sessions_ended = 0  # sessions ended by a reload: key no longer allowed, or rights shrank
        self.hello_refused = 0  # HELLOs from a connected key that is no longer allowed
        self.reloads = 0  # SIGHUPs handled (the allowlist and, with a config file, the entitlements)
        self.reload_failed = 0  # SIGHUPs whose config file did not read: the entitlements stayed
        self.allowlist_errors = 0  # allowlist reads that skipped a file that is not a key, or could not read the directory
        self.skipped: list[str] = []  # the files the last read skipped (logged when that changes)
        self.monitor: zmq.Socket | None = None
        self.allow_stamp: tuple = ()
        self.reload()

    def apply(self, sock: zmq.Socket) -> zmq.Socket:
        """Make ``sock`` a CURVE server; returns the monitor socket the loop polls."""
        sock.curve_server = True
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.zap_domain = ZAP_DOMAIN.encode()
        self.monitor = sock.get_monitor_socket(HANDSHAKE_FAILED)
        return self.monitor

    def count_refusals(self) -> None:
        """Count (and log) the handshakes the ROUTER refused since the last call."""
        if self.monitor is None:
            return
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            self.refused += 1
            causes: dict[int, str] = {zmq.EVENT_HANDSHAKE_FAILED_AUTH: "unknown or refused key",
                                      zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol error (a plaintext client?)"}
            kind = causes.get(int(event["event"]), "handshake failed (a plaintext client?)")
            log.warning("refused a connection: %s", kind)

    def stamp(self) -> tuple:
        """What a change of the allowlist changes: its key files' names, times and sizes
        (other files coming and going read nothing again); a directory that cannot be
        read stamps apart from an empty one, so that either change is read."""
        d = self.section.allow
        try:
            return tuple(sorted((e.name, *entry_stamp(e)) for e in os.scandir(d) if is_key_name(e.name)))
        except OSError as exc:
            return ("(unreadable)", exc.errno or 0)

    def reload(self, stamp: tuple | None = None) -> None:
        """Read the allowlist again (also on SIGHUP). The loop then ends the sessions
        whose key lost its rights (``Server.recheck_sessions``). ``stamp``: the
        directory's, when the caller has just taken it."""
        self.allow_stamp = self.stamp() if stamp is None else stamp
        keys = self.read_allowlist()
        if keys is not None:
            self.auth.allow_any = False
            self.auth.certs[ZAP_DOMAIN] = keys  # (one assignment: the ZAP thread reads it)
        log.info("allowlist %s: %d keys", self.section.allow, len(self.auth.certs.get(ZAP_DOMAIN, {})))

    def read_allowlist(self) -> dict[bytes, bool] | None:
        """The allowlist's public keys (its ``*.key`` files), one file at a time. pyzmq's
        ``configure_curve`` gives up on the whole directory at the first file that is not
        a key, and keeps the keys it had: one half-copied file then undid every removal.
        Here such a file is skipped and named (``allowlist_errors``), and the rest take
        effect; a directory that cannot be read at all keeps the keys as they were."""
        where = self.section.allow
        skipped: list[str] = []
        names: list[str] = []
        try:
            for entry in os.scandir(where):
                if not is_key_name(entry.name):
                    continue
                # Only regular files of a certificate's size are opened: a FIFO would block the
                # loop for good, and a huge file would be read at every change of the directory.
                try:
                    regular, size = entry.is_file(), entry.stat().st_size
                except OSError as exc:  # (a dangling link; a file removed meanwhile)
                    skipped.append(f"{entry.name!r} ({exc.strerror})")
                    continue
                if not regular:
                    skipped.append(f"{entry.name!r} (not a regular file)")
                elif size > CERTIFICATE_BYTES_MAX:
                    skipped.append(f"{entry.name!r} (over {CERTIFICATE_BYTES_MAX:,} bytes)")
                else:
                    names.append(entry.name)
        except OSError as exc:
            self.allowlist_errors += 1
            log.error("allowlist %s cannot be read (%s): the allowed keys stay as they were", where, exc)
            return None
        keys: dict[bytes, bool] = {}
        for name in sorted(names):
            try:
                public, _ = zmq.auth.load_certificate(os.path.join(where, name))
            except Exception as exc:  # (any file can land there: say which, and go on)
                skipped.append(f"{name!r} ({type(exc).__name__}: {str(exc)[:200]!r})")
                continue
            if is_public_key(public):
                keys[public] = True
            else:
                skipped.append(f"{name!r} (no 40-character Z85 public key in it)")
        if skipped:
            self.allowlist_errors += 1
            if skipped != self.skipped:  # said once for as long as the same files stay bad
                log.error("allowlist %s: %d file(s) skipped, not CURVE public key certificates (their keys are not "
                          "allowed): %s", where, len(skipped), "; ".join(skipped[:20]))
        self.skipped = skipped
        return keys

    def reload_if_changed(self) -> bool:
        stamp = self.stamp()
        if stamp != self.allow_stamp:
            self.reload(stamp)
            return True
        return False

    def set_rules(self, section: SecuritySection) -> None:
        """Replace the entitlements (``[security.default]`` and ``[[security.client]]``,
        checked by ``check_section``); takes effect for open sessions at the next reload,
        which ends those whose rights shrank."""
        self.section = msgspec.structs.replace(self.section, default=section.default, client=section.client)
        self.rules = {public_key_of(c.key, "security.client"): c for c in section.client}

    def allowed(self, user_id: str | None) -> bool:
        """Is this key (a ZAP User-Id: the z85 public key) in the allowlist now?"""
        if not user_id:
            return False
        return user_id.encode() in self.auth.certs.get(ZAP_DOMAIN, {})

    def rights_of(self, user_id: str | None) -> Rights:
        if not user_id:
            return NO_RIGHTS  # no key: nothing
        return self.rules.get(user_id.encode(), self.section.default)

    def stats(self) -> dict[str, Any]:
        return {"on": True, "refused": self.refused, "allowed_keys": len(self.auth.certs.get(ZAP_DOMAIN, {})),
                "server_key": self.public.decode(), "key_mismatch": self.key_mismatch,
                "sessions_ended": self.sessions_ended, "hello_refused": self.hello_refused,
                "reloads": self.reloads, "reload_failed": self.reload_failed,
                "allowlist_errors": self.allowlist_errors}

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close(0)
        self.auth.stop()


def check(rights: Rights, kind: str, name: str) -> None:
    if not rights.allows(kind, name):
        raise NotEntitledError(f"this client's key may not {kind} {name[:80]!r}")
