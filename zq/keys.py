"""CurveZMQ keys: read them (a z85 key or a certificate file), write a pair (``zq
keygen``), and give a client socket its keys. Shared by clients, the CLI and the
dispatcher's config; the dispatcher's side of security is ``zq.server.security``."""

from __future__ import annotations

import os
import re
from typing import Any

import zmq
import zmq.auth

from zq.core.errors import ConfigError

KEY_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")


def public_key_of(text: str, where: str) -> bytes:
    """A z85 public key, given as itself or as a certificate file."""
    if len(text) == 40 and not os.path.exists(text):
        return text.encode()
    try:
        public, _ = zmq.auth.load_certificate(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot read a public key from {text!r}: {exc}") from None
    return public


def client_curve(key: Any = None, server_key: Any = None) -> tuple[bytes, bytes, bytes] | None:
    """(public, secret, server public) for a client socket, or None for plaintext.

    ``key``: the client's secret certificate file (``NAME.key_secret``) or a
    (public, secret) pair; ``server_key``: the server's public certificate file or its
    z85 key. Each defaults to ``$ZQ_KEY`` / ``$ZQ_SERVER_KEY``."""
    key = key if key is not None else os.environ.get("ZQ_KEY") or None
    server_key = server_key if server_key is not None else os.environ.get("ZQ_SERVER_KEY") or None
    if key is None and server_key is None:
        return None
    if key is None or server_key is None:
        raise ValueError("CurveZMQ needs both key= (your .key_secret) and server_key= (the server's public key)")
    if isinstance(key, (tuple, list)):
        public, secret = (k.encode() if isinstance(k, str) else k for k in key)
    else:
        try:
            public, secret = zmq.auth.load_certificate(str(key))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the client key {key!r}: {exc}") from None
        if not secret:
            raise ValueError(f"{key!r} holds no secret key: pass the .key_secret file")
    if isinstance(server_key, bytes) and len(server_key) == 40:
        server_public = server_key
    else:
        try:
            server_public = public_key_of(str(server_key), "server_key")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return public, secret, server_public


def apply_client_curve(sock: zmq.Socket, curve: tuple[bytes, bytes, bytes] | None) -> None:
    if curve is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve


def keygen(directory: str, name: str) -> tuple[str, str]:
    """Write NAME.key (public, to share) and NAME.key_secret (keep) in ``directory``."""
    if not KEY_NAME.fullmatch(name):
        raise ValueError(f"a key's name is 1..64 letters, digits, '.', '_' or '-' (not a path), got {name[:80]!r}")
    os.makedirs(directory, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, name)
    os.chmod(secret, 0o600)
    return public, secret
