"""zq embedded in a host process (the trading / analytics shape): the server loop on a
background thread, reachable over inproc from the same process and over tcp from others,
and directly (``zq.Publisher(d)``, ``zq.Worker(d, queue)``: zq.server.local) from the
threads of the process itself."""

from __future__ import annotations

import os
import threading

import msgspec
import zmq

from zq.core.errors import ZqError
from zq.server.config import Config
from zq.server.local import LocalLink
from zq.server.loop import Server


class Dispatcher:
    """zq embedded in a host process: the server loop on a background thread.

    >>> d = Dispatcher(Config(data=tmp, bind=["tcp://127.0.0.1:0"])).start()  # doctest: +SKIP
    >>> c = zq.connect(d.inproc)  # doctest: +SKIP
    >>> p = zq.Publisher(d)       # the direct path: this thread steps the dispatcher  # doctest: +SKIP
    """

    _serial = 0

    def __init__(self, config: Config | None = None, *, context: zmq.Context | None = None) -> None:
        self.config = config or Config()
        Dispatcher._serial += 1
        self.inproc = f"inproc://zq-{os.getpid()}-{Dispatcher._serial}"
        self.ctx = context or zmq.Context.instance()
        self.server: Server | None = None
        self.thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, path: str) -> "Dispatcher":
        return cls(Config.load(path))

    @property
    def endpoints(self) -> list[str]:
        assert self.server is not None, "start() the dispatcher first"
        return self.server.endpoints

    @property
    def endpoint(self) -> str:
        """The first non-inproc endpoint (what other processes connect to)."""
        return next((e for e in self.endpoints if not e.startswith("inproc://")), self.inproc)

    def __str__(self) -> str:
        return f"the embedded dispatcher ({self.inproc})"

    def open_link(self, name: str) -> LocalLink:
        """An in-process session for ``zq.Publisher(d)`` / ``zq.Worker(d, queue)``: the
        calling thread steps the dispatcher itself (zq.server.local)."""
        if self.server is None:
            raise ZqError("start() the dispatcher before opening a session on it")
        return self.server.open_link(name)

    def start(self) -> "Dispatcher":
        config = msgspec.structs.replace(self.config, bind=[*self.config.bind, self.inproc])
        self.server = Server(config, context=self.ctx)
        self.thread = threading.Thread(target=self.server.run, name="zq-dispatcher", daemon=True)
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.server is not None and self.thread is not None:
            self.server.stop()
            self.thread.join(timeout)
            if self.thread.is_alive():
                raise RuntimeError("dispatcher thread did not stop in time")

    def __enter__(self) -> "Dispatcher":
        return self.start() if self.server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
