"""Small file-system helpers: hashing, atomic writes, output-directory checks.

Every output of the project is written to a temporary name next to its final path and renamed
into place, so an interrupted run never leaves a half-written file under a final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from benchmark.errors import BenchError

INCOMPLETE = ".incomplete"
_CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj) -> bytes:
    """The one JSON encoding used for everything that is hashed: sorted keys, no NaN."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=INCOMPLETE, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; final files get the usual permissions
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
    """Make sure ``path`` does not exist yet, or remove it when ``overwrite`` allows.

    Only a directory that holds one of ``marker_files`` (i.e. something this project wrote) or is
    empty is ever deleted, so ``--overwrite`` cannot wipe an unrelated folder. With
    ``remove=False`` only the checks run (call it again with ``remove=True`` once the
    replacement is ready, so a failed job keeps the old output).
    """
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise BenchError(f"{what} {str(path)!r} exists and is not a directory; choose another path")
        contents = list(path.iterdir())
        if contents:
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
