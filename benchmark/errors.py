"""User-facing errors.

Every ``BenchError`` carries one line that says what was wrong, with the value, and how to fix
it. The CLI prints it as ``error: <message>`` and exits non-zero; anything else that escapes is
a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # terminal colour/cursor codes
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class BenchError(Exception):
    """An error caused by the user's input or environment, with a one-line message."""

    exit_code = 2


class NotFoundError(BenchError, KeyError):
    """An unknown name (suite, config, model, shift, ...)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class IntegrityError(BenchError):
    """A file whose bytes do not match its recorded hash, or a manifest that does not fit."""

    exit_code = 3


class OfflineError(BenchError):
    """Something needs the network (or a cached snapshot) that is not there."""


def one_line(text: object, limit: int | None = None) -> str:
    """``text`` as one printable line: terminal escapes and control characters removed, lines joined.

    Messages quote outside text (exception texts, file names) that may hold newlines or colour codes.
    """
    line = " ".join(part.strip() for part in _CONTROL.sub("\n", _ESCAPE.sub("", str(text))).split("\n") if part.strip())
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"


def did_you_mean(name: str, choices: Iterable[str], *, n: int = 3) -> str:
    """``" Did you mean 'x'?"`` for the closest choices, or ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=n, cutoff=0.5)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


def unknown(kind: str, name: str, choices: Iterable[str], *, hint: str = "") -> NotFoundError:
    """Build the standard unknown-name error: what, the value, close matches, where to look."""
    choices = sorted(choices)
    msg = f"unknown {kind} {name!r}.{did_you_mean(name, choices)}"
    if hint:
        msg += f" {hint}"
    elif len(choices) <= 30:
        msg += f" Known: {', '.join(choices)}."
    return NotFoundError(msg)
