"""Regular expressions from users, matched in time linear in the input.

Every pattern a peer or a config file supplies (a filter's MATCHES / ``~`` / LIKE, a
queue's ``topics``, a REPLAY or RANGE target) runs inside the dispatch loop or its
reader thread. Python's ``re`` backtracks: ``^(a+)+$`` doubles its work per character,
and even ``.*a.*x`` spends 20 s on one 4 KiB header (measured). A syntactic check for
nested repetition cannot catch the second kind, so zq does not try to guess which
patterns are safe: it compiles them with RE2 (``pyre2``), whose automaton matches in
one pass, and refuses what RE2 cannot do in linear time (backreferences, lookaround)
with a clear error instead of falling back to a backtracking engine.
"""

from __future__ import annotations

import re
from typing import Any

import re2

PATTERN_CHARS_MAX = 1024


class PatternError(ValueError):
    """A pattern zq refuses; the message says why."""


def compile_pattern(pattern: str, *, dotall: bool = False) -> Any:
    """A compiled RE2 pattern with ``fullmatch`` / ``search`` (the ``re`` API)."""
    if not isinstance(pattern, str):
        raise PatternError(f"a pattern must be a string, got {type(pattern).__name__}")
    if len(pattern) > PATTERN_CHARS_MAX:
        raise PatternError(f"pattern longer than {PATTERN_CHARS_MAX} characters")
    try:
        compiled = re2.compile(pattern, re.DOTALL if dotall else 0)
    except (re.error, re2.error) as exc:  # type: ignore[attr-defined]
        raise PatternError(f"bad regular expression ({exc})") from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise PatternError(f"bad regular expression ({exc})") from None
    if isinstance(compiled, re2.FallbackPattern):
        raise PatternError("regular expression refused: RE2 cannot match it in linear time "
                           "(backreferences, lookaround, or a repetition count above 1000)")
    return compiled
