"""Help in words a user knows: ``--lease DURATION``, ``zq purge QUEUE``, not ``<str>`` or
``{queue}``. Typer labels every option with its Python type; this walks the finished
command tree once and gives each parameter a word for what it takes, by its name
first (an endpoint, a duration, an expression) and its type otherwise."""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument

# What an option takes, by the parameter's name: the same word wherever it appears.
WORDS: dict[str, str] = {
    "endpoint": "ENDPOINT", "bind": "ENDPOINT", "metrics": "[HOST:]PORT",
    "key": "FILE", "server_key": "FILE", "config": "FILE",
    "data": "DIR", "directory": "DIR",
    "filter": "EXPR", "aggregate": "EXPR", "barrier": "EXPR",
    "group_by": "COLUMN", "group": "GROUP", "msg_id": "ID", "header": "KEY=VALUE",
    "exec_": "COMMAND", "from_": "FROM", "to_seq": "BOOKMARK",
    "lease": "DURATION", "expiration": "DURATION", "dedup_window": "DURATION",
    "timeout": "SECONDS", "wait": "SECONDS", "interval": "SECONDS",
    "max_bytes": "SIZE", "topics": "REGEX", "dead_letter": "TOPIC",
    "group_header": "HEADER", "lvq_key": "KEY", "sort_key": "KEY",
    "durability": "MODE", "semantics": "MODE", "fairness": "STRATEGY", "group_policy": "POLICY",
    "overflow": "POLICY", "fmt": "FORMAT", "fail_rate": "FRACTION",
}
BY_TYPE = {"int": "N", "float": "NUMBER", "str": "TEXT", "list[str]": "TEXT"}


class NamedArgument(TyperArgument):
    """An argument shown in the usage line by its name alone (``QUEUE``, ``[DATA]``):
    typer writes a required one as ``{queue}``, which reads like a placeholder syntax."""

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        return name if self.required else f"[{name}]"

    def display_type_rich(self, ctx: Any) -> str | None:
        return None  # the name column says it already


def word_for(param: Any) -> str:
    if isinstance(param, TyperArgument):
        return str(param.name).upper()
    if getattr(param, "is_flag", False):
        return ""  # a flag takes nothing
    return WORDS.get(str(param.name)) or BY_TYPE.get(param.bare_type(), "VALUE")


def plain_words(command: Any) -> Any:
    """Label every parameter of ``command`` and its subcommands (in place; returns it)."""
    for param in command.params:
        if param.metavar is None:
            param.metavar = word_for(param)
        if isinstance(param, TyperArgument):
            param.__class__ = NamedArgument
    make_help_option = command.get_help_option

    def help_option(ctx: Any) -> Any:  # click adds --help at run time: a flag, no type
        option = make_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        plain_words(sub)
    return command
