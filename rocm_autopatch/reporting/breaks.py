"""Graph breaks as torch logs them: its ``graph_breaks`` records (what
``TORCH_LOGS=graph_breaks`` prints) read into where, reason, explanation and hints, and the
handler that listens for them. The wording differs per release; both forms are read.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Dict, Optional

TEXT_LIMIT = 2000  # characters kept of a reason torch states
# torch's graph-break record: "Graph break in user code at FILE:LINE" (also "Graph break
# (user stack suppressed due to duplicate graph break) in user code at FILE:LINE").
_BREAK_AT = re.compile(r"[Gg]raph break.*? in user code at (.+?):(\d+)\s*$", re.MULTILINE)
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def clip(text: Any, limit: int = TEXT_LIMIT) -> str:
    """What torch states, stripped and cut to ``limit`` characters."""
    return str(text).strip()[:limit]


def parse_break(message: str, error: Optional[BaseException] = None) -> Dict[str, Any]:
    """One record of torch's ``graph_breaks`` log -> where, reason, explanation, hints.
    ``error``: the exception the record carries (torch < 2.5 logs "Graph break: from user
    code at:" and the user stack, with the reason only in the record's ``exc_info``)."""
    where = _BREAK_AT.search(message)
    if where:
        file, line = where.group(1), int(where.group(2))
    else:  # older wording: the innermost user frame of the stack it prints
        frames = _FILE_LINE.findall(message)
        file, line = (frames[-1][0], int(frames[-1][1])) if frames else ("<unknown>", 0)
    body = message.split("Graph Break Reason:", 1)[1] if "Graph Break Reason:" in message \
        else message
    body = body.split("User code traceback:", 1)[0]
    lines = [raw.strip() for raw in body.splitlines() if raw.strip()]
    titles = [ln for ln in lines if not ln.startswith(("Explanation:", "Hint:", "Developer",
                                                       "For more details", "Graph break"))]
    if len(titles) > 1 and titles[0].startswith("Encountered graph break when attempting"):
        titles = titles[1:]  # torch's generic prefix; the next line names the break
    if error is not None and "Reason:" not in message:
        said = (str(error).strip().splitlines() or [""])[0]
        titles = [f"{type(error).__name__}: {said}".rstrip(": ")]
    return {
        "file": file, "line": line,
        "reason": clip(titles[0] if titles else "not stated by torch", 300),
        "explanation": clip(next((ln[len("Explanation:"):].strip() for ln in lines
                                    if ln.startswith("Explanation:")), ""), 600),
        "hints": [clip(ln[len("Hint:"):].strip(), 400) for ln in lines
                  if ln.startswith("Hint:")][:4],
    }


class Listener(logging.Handler):
    """Receives torch's graph-break records (a handler on its artifact loggers) and hands
    each to ``take(message, error)``."""

    def __init__(self, take: Callable[[str, Optional[BaseException]], None]) -> None:
        super().__init__(logging.DEBUG)
        self.take = take

    def emit(self, record_: logging.LogRecord) -> None:
        try:
            error = record_.exc_info[1] if record_.exc_info else None
            self.take(record_.getMessage(), error)
        except Exception:  # noqa: BLE001 - counting must never break tracing
            pass
