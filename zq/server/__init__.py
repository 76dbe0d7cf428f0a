"""The dispatcher: what runs inside the ``zq serve`` process (or a host process, with
``Dispatcher``). ``loop`` reads frames and steps the engine; ``commands`` handles each
command type; ``admin`` the operator actions; ``ranges`` and ``replay`` read the
journal beside the loop; ``metrics`` and ``security`` serve and guard it; ``config``
reads zq.toml. See docs/architecture.md for what each room may import."""

from zq.server.config import Config
from zq.server.dispatcher import Dispatcher
from zq.server.loop import Server

__all__ = ["Config", "Dispatcher", "Server"]
