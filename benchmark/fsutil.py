"""File-system helpers: the cache root, hashing, bounded reads and THE parsers of untrusted JSON and
YAML, atomic writes (a temporary name beside the final path, renamed into place), output-folder checks."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from genshift.errors import BenchError, IntegrityError, first_line

INCOMPLETE = ".incomplete"
MAX_JSON_DEPTH = 32  # no file of the project nests deeper (a result: 6 levels)
FIX = "it was not written by genshift-bench (re-download or rebuild it)"
MAX_LIST_BYTES = 1 << 20  # a list file (--models, trusted keys): thousands of lines fit in far less


def cache_root() -> Path:
    """``<HF_HOME>/genshift``, ``HF_HOME`` by huggingface_hub's rule read at each call (``docs/hub.md`` section 3)."""
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "genshift"


@dataclass(frozen=True)
class StatKey:
    """"Has this file changed since it was looked at?": size, mtime, ctime, inode and device (a file rewritten,
    replaced, touched, chmod-ed or copied gets another key; hashable; ``list(astuple(k))`` for JSON)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int

    @classmethod
    def of(cls, path: str | os.PathLike) -> StatKey:
        st = os.stat(path)
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def sha256_file(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj) -> bytes:
    """The one JSON encoding used for everything that is hashed: sorted keys, no NaN."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode()


def read_limited(path: str | os.PathLike, *, max_bytes: int, what: str,
                 fix: str = "it cannot be a valid {what} (re-download or rebuild it)") -> bytes:
    """The bytes of a file from outside, refused (one line, then ``fix``) when larger than ``max_bytes``; at
    most ``max_bytes + 1`` bytes are read whatever ``st_size`` says (``/dev/zero``, a pipe, a growing file)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise IntegrityError(f"{what} {str(path)!r} does not exist; check the path") from None
    except OSError as e:
        raise IntegrityError(f"{what} {str(path)!r} cannot be read ({e.strerror}); check the file") from None
    if len(data) > max_bytes:
        raise IntegrityError(f"{what} {str(path)!r} is larger than {max_bytes} bytes; {fix.format(what=what)}")
    return data


def read_text_limited(path: str | os.PathLike, *, max_bytes: int, what: str, fix: str = "is it the right file?",
                      encoding_fix: str = "save it as UTF-8") -> str:
    """A UTF-8 text file read with :func:`read_limited`, BOM dropped; not UTF-8: one line naming the byte and line."""
    data = read_limited(path, max_bytes=max_bytes, what=what, fix=fix)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise IntegrityError(f"{what} {str(path)!r} is not UTF-8 text (byte 0x{data[e.start]:02x} on line {line}); "
                             f"{encoding_fix}") from None


def _no_duplicates(pairs):
    obj = dict(pairs)
    if len(obj) != len(pairs):
        keys = [k for k, _ in pairs]
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"duplicate key {dup[:64]!r}")
    return obj


def _no_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def parse_json(data: bytes, *, where: str, max_bytes: int, what: str = "", max_depth: int = MAX_JSON_DEPTH,
               fix: str = FIX):
    """THE parser for untrusted JSON. Refuses, each with one ``IntegrityError`` line (``{where}: {what} ...;
    {fix}``): more than ``max_bytes``, nesting deeper than ``max_depth`` (never a ``RecursionError``),
    invalid UTF-8 or JSON, NaN/Infinity and duplicate keys (two readers could see two documents)."""
    subject = f"{where}: {what}" if what else where
    if len(data) > max_bytes:
        raise IntegrityError(f"{subject} is {len(data)} bytes, over the limit of {max_bytes}; {fix}")
    too_deep = IntegrityError(f"{subject} nests deeper than {max_depth} levels; {fix}")
    try:
        # json's C scanner guards its recursion: a very deep file raises RecursionError, cleanly
        obj = json.loads(data.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise too_deep from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise IntegrityError(f"{subject} is not valid JSON ({str(e)[:200]}); {fix}") from None
    level, depth = [obj] if type(obj) in (dict, list) else [], 0  # level by level: no recursion
    while level:
        depth += 1
        if depth > max_depth:
            raise too_deep
        level = [c for node in level for c in (node.values() if type(node) is dict else node)
                 if type(c) in (dict, list)]
    return obj


def read_json(path: str | os.PathLike, *, max_bytes: int, what: str, where: str | None = None,
              max_depth: int = MAX_JSON_DEPTH):
    """:func:`parse_json` of a file read with :func:`read_limited` (errors name ``where``, else the path)."""
    data = read_limited(path, max_bytes=max_bytes, what=what)
    return parse_json(data, where=where or str(path), what=what, max_bytes=max_bytes, max_depth=max_depth)


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and non-finite numbers, as :func:`parse_json` does."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {str(key)[:64]!r}",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_finite_float(self, node):
        value = self.construct_yaml_float(node)
        if not math.isfinite(value):
            raise yaml.constructor.ConstructorError(None, None, f"{node.value[:20]!r} is not a finite number",
                                                    node.start_mark)
        return value


_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_finite_float)


def load_yaml(text: str, *, where: str, what: str, max_depth: int, fix: str = ""):
    """THE parser for untrusted YAML: the parser's events are walked first, refusing aliases (billion laughs)
    and nesting deeper than ``max_depth``, then the document is built by :func:`parse_json`'s rules; every
    refusal is one ``IntegrityError`` (``{where}: {what} ...{fix}``)."""
    try:
        depth = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise IntegrityError(f"{where}: {what} uses aliases ('*name'), which this file never needs{fix}")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > max_depth:
                    raise IntegrityError(f"{where}: {what} nests deeper than {max_depth} levels{fix}")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no object is built from tags
    except yaml.YAMLError as e:
        raise IntegrityError(f"{where}: {what} does not parse ({first_line(e, 160)}){fix}") from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A new temporary path beside ``path`` (mode 0666 less the umask), renamed to ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(6)}{INCOMPLETE}")
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))  # the kernel applies the umask
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        if e.filename is None:  # pyarrow and file.write report only the errno: name the file being written
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_bytes(path, canonical_json(obj))


def ensure_writable_dir(path: str | os.PathLike, *, what: str = "output directory") -> Path:
    """Create ``path`` if needed and check that files can be created in it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as e:
        raise BenchError(f"{what} {str(path)!r} is not writable ({e.strerror}); choose another path "
                         "or fix its permissions") from None
    return path


def prepare_fresh_dir(path: str | os.PathLike, *, overwrite: bool, marker_files: tuple[str, ...],
                      what: str = "output directory", remove: bool = True) -> Path:
    """Make sure ``path`` does not exist yet, or remove it when ``overwrite`` allows: only an empty folder or
    one holding one of ``marker_files`` (written by this project) is ever deleted. ``remove=False``: the
    checks only (call again once the replacement is ready, so a failed job keeps the old output)."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise BenchError(f"{what} {str(path)!r} exists and is not a directory; choose another path")
        if any(path.iterdir()):
            if not overwrite:
                raise BenchError(f"{what} {str(path)!r} already exists; pass --overwrite to replace it "
                                 "or choose another path")
            if not any((path / m).exists() for m in marker_files):
                raise BenchError(f"{what} {str(path)!r} is not empty and was not written by bench "
                                 f"(no {' or '.join(marker_files)}); refusing to delete it")
        if remove:
            shutil.rmtree(path)
    ensure_writable_dir(path.parent, what=f"parent of the {what}")
    return path
