"""Doctor text at 80 columns: wrap long lines without ever breaking a path or a key phrase.

A user copies paths and searches for phrases ("hit the recompile limit"); where a line
wraps must not depend on how deep a checkout or a temporary directory is. ``keep`` marks a
span that stays on one line (its spaces become no-break spaces, which ``textwrap`` does
not split at; ``fit`` turns them back). ``Verbatim`` marks a whole line printed as is.
"""

from __future__ import annotations

import textwrap

WIDTH = 80
_NBSP = "\u00a0"


class Verbatim(str):
    """A line printed as is, however long (an install path to copy)."""


def keep(span: str) -> str:
    """``span`` as one unbreakable unit inside a line that ``fit`` may wrap."""
    return str(span).replace(" ", _NBSP)


def fit(line: str, width: int = WIDTH) -> str:
    """``line`` wrapped to ``width`` at spaces outside kept spans; kept spans, paths and
    other long words are never split (a line may exceed ``width`` only for them)."""
    if isinstance(line, Verbatim):
        return str(line)
    if len(line) > width:
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        line = textwrap.fill(line, width, subsequent_indent=indent, break_on_hyphens=False,
                             break_long_words=False)
    return line.replace(_NBSP, " ")
