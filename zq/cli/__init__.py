"""The ``zq`` command: ``app`` (serve, demo, publish, stats, top, keygen), ``access``
(consume, claim, peek, query, replay and the operator commands), ``journal`` (inspect a
journal directory), with ``common`` (endpoints, keys, exit codes) and ``views`` (rich
renderers). It may import every other room: it is the outermost one."""

from zq.cli.app import app, main

__all__ = ["app", "main"]
