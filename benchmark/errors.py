"""User-facing errors: a ``BenchError`` is one line saying what was wrong, with the value, and how to fix
it; the CLI prints ``error: <message>`` and exits non-zero (anything else that escapes is a bug)."""

from __future__ import annotations

import difflib
import errno
import os
import re
from collections.abc import Iterable

_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # terminal colour/cursor codes
# C0 controls and DEL: never shown raw in one line of error or table text
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


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


# What to do about an OSError from the environment, by errno (the CLI prints one line, never a traceback).
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\] [^:\n]*(?:: '([^'\n]*)')?")
_RERUN = "then rerun: finished outputs are kept and the rerun resumes"
_OS_FIXES = {
    errno.ENOSPC: f"free disk space or write elsewhere (--out), {_RERUN}",
    errno.EDQUOT: f"free space under your disk quota or write elsewhere (--out), {_RERUN}",
    errno.EFBIG: f"the file system refuses files this large; write elsewhere (--out), {_RERUN}",
    **dict.fromkeys((errno.EACCES, errno.EPERM), f"fix its permissions or choose another path, {_RERUN}"),
    errno.EROFS: f"choose a writable path (e.g. another --out), {_RERUN}",
    errno.EMFILE: f"too many open files; raise the limit (ulimit -n) or use fewer --workers, {_RERUN}",
    errno.ENFILE: f"too many open files on the system; close some programs, {_RERUN}",
    errno.EIO: f"the disk reported an input/output error; check it, {_RERUN}",
    errno.ENOENT: "check the path (a folder may have been removed while bench ran)",
}
_NETWORK = "the network or the Hub did not answer; check the connection and HF_ENDPOINT, then rerun"
_OS_FIXES.update({code: _NETWORK for code in (errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT,
                                               errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNABORTED)})


def os_error_message(e: OSError) -> str:
    """One line for an ``OSError`` that reached the CLI: what failed, on which path (``e.filename``, which
    :func:`genshift.fsutil.atomic_path` adds where pyarrow and ``file.write`` give only the errno), the fix."""
    code, filename, filename2 = e.errno, e.filename, e.filename2
    # re-raised from a DataLoader worker: the original error is the traceback's last line
    if code is None and (m := _ERRNO_TEXT.search(str(e))):
        code, filename = int(m.group(1)), m.group(2)
    # os.strerror: pyarrow's strerror is "Error writing bytes to file. Detail: [errno 28] ..."
    reason = (f"{os.strerror(code)} ({errno.errorcode.get(code, code)})" if code is not None
              else (e.strerror or str(e) or type(e).__name__).strip().splitlines()[-1])
    where = f" on {str(filename)!r}" if filename is not None else ""
    if filename2 is not None:
        where += f" -> {str(filename2)!r}"
    fix = _OS_FIXES.get(code, _NETWORK if isinstance(e, (ConnectionError, TimeoutError)) else
                        f"check the path and the disk, {_RERUN}")
    return one_line(f"{reason}{where}; {fix}")


def first_line(text: object, limit: int | None = 200) -> str:
    """The first non-blank line of ``text`` (an exception's paragraph) through :func:`one_line`; ``""`` if none."""
    return one_line(next((ln for ln in str(text).splitlines() if ln.strip()), ""), limit)


def one_line(text: object, limit: int | None = None) -> str:
    """``text`` from outside as one printable line: terminal escapes and control characters removed, lines joined."""
    parts = CONTROL_CHARS.sub("\n", _ESCAPE.sub("", str(text))).split("\n")
    line = " ".join(part.strip() for part in parts if part.strip())
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"


def did_you_mean(name: str, choices: Iterable[str], *, n: int = 3) -> str:
    """``" Did you mean 'x'?"`` for the closest choices, or ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=n, cutoff=0.5)
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?" if close else ""


def unknown(kind: str, name: str, choices: Iterable[str], *, hint: str = "") -> NotFoundError:
    """Build the standard unknown-name error: what, the value, close matches, where to look."""
    choices = sorted(choices)
    msg = f"unknown {kind} {name!r}.{did_you_mean(name, choices)}"
    if hint:
        msg += f" {hint}"
    elif len(choices) <= 30:
        msg += f" Known: {', '.join(choices)}."
    return NotFoundError(msg)
