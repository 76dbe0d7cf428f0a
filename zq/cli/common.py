"""What every ``zq`` command shares: exit codes, the endpoint option, a client."""

from __future__ import annotations

import base64
import json
import os

import typer

from zq.wire import DEFAULT_ENDPOINT

RET_OK = 0
RET_ERROR = 1
RET_USAGE = 2
RET_CONNECT = 3

EndpointOpt = typer.Option(None, "--endpoint", "-e", help=f"dispatcher endpoint (env ZQ_ENDPOINT, default {DEFAULT_ENDPOINT})")


def endpoint_of(endpoint: str | None) -> str:
    return endpoint or os.environ.get("ZQ_ENDPOINT") or DEFAULT_ENDPOINT


def fail(message: str, code: int = RET_ERROR) -> typer.Exit:
    typer.echo(f"zq: {message}", err=True)
    return typer.Exit(code)


def client_for(endpoint: str | None, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    """A client of the dispatcher, or exit 3 saying why not: nothing listening there
    (within about half a second), a handshake it refused (which keys, at once), or no
    answer within ``timeout`` seconds."""
    from zq.client import Client, ConnectionLost
    from zq.client.session import HandshakeRefused

    ep = endpoint_of(endpoint)
    try:
        return Client(ep, connect_timeout=timeout, wait_for_dispatcher=False)
    except ValueError as exc:  # an endpoint or a key that cannot be used
        raise fail(str(exc), RET_USAGE) from None
    except HandshakeRefused as exc:  # it is running: the keys are what to look at
        raise fail(f"{exc} (keys: --key and --server-key, or ZQ_KEY and ZQ_SERVER_KEY)", RET_CONNECT) from None
    except ConnectionLost as exc:
        raise fail(f"{exc}: is `zq serve` running? set --endpoint or ZQ_ENDPOINT", RET_CONNECT) from None


def message_json(msg, not_before_ms: int | None = None) -> str:  # type: ignore[no-untyped-def]
    doc = {"bookmark": msg.bookmark, "topic": msg.topic, "headers": msg.headers, "group": msg.group, "deliveries": msg.deliveries}
    if not_before_ms is not None:  # peek: it waits for its retry or its publish's delay
        doc["not_before_ms"] = not_before_ms
    try:
        doc["data"] = msg.data.decode("utf-8")
    except UnicodeDecodeError:
        doc["data"] = base64.b64encode(msg.data).decode()
        doc["encoding"] = "base64"
    return json.dumps(doc, ensure_ascii=False)
