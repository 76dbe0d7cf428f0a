"""What an engine step asks its adapter to do: journal these records, send these
deliveries. msgspec structs, so they live apart from the compiled modules (mypyc
drops a Struct's class keywords: ``Deliver`` would encode as a map, not an array)."""

from __future__ import annotations

from typing import Any

import msgspec


class Deliver(msgspec.Struct, array_like=True, gc=False):
    """Send these messages to subscription ``sub_id`` (payloads come from the journal)."""

    sub_id: str
    queue: str
    seqs: list[int]
    deliveries: list[int]


class Revoke(msgspec.Struct, array_like=True, gc=False):
    """Ask subscription ``sub_id`` for these deliveries back, if it has not started them
    (reclaiming: ``epochs`` are their delivery counts, so the answer names the delivery)."""

    sub_id: str
    queue: str
    seqs: list[int]
    epochs: list[int]


class Output(msgspec.Struct, gc=False):
    records: list[Any]
    deliveries: list[Deliver]
    revokes: list[Revoke] = []
