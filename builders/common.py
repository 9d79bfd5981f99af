"""What every builder shares: its typed config's base (:class:`BuildConfig`, fields made with :func:`option`,
checked once when made) and the steps the three builders take alike (``docs/builders.md``).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib.metadata
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

from genshift.errors import BenchError, first_line
from genshift.fsutil import atomic_path, atomic_write_json, sha256_file

log = logging.getLogger(__name__)


class ConfigError(BenchError):
    """A builder config field with a bad value (``field`` names it; the CLI maps it to its flag)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.field, self.message = name, message


def option(default, help: str, **cli):
    """A config field with its help text and CLI hints (``choices``, ``min``, ``flag``, ``metavar``)."""
    return field(default=default, metadata={"help": help, **cli})


@dataclass(frozen=True)
class Checked:
    """A frozen config checked once when made: each field's ``min`` and ``choices``, then :meth:`check`."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v, m = getattr(self, f.name), f.metadata
            if v is None:
                continue
            if "min" in m and v < m["min"]:
                raise ConfigError(f.name, f"must be at least {m['min']}, got {v}")
            for item in v if isinstance(v, tuple) else (v,):
                if "choices" in m and item not in m["choices"]:
                    close = difflib.get_close_matches(str(item), list(map(str, m["choices"])), n=1)
                    raise ConfigError(f.name, f"{item!r} is not one of {', '.join(map(str, m['choices']))}"
                                              + (f"; did you mean {close[0]!r}?" if close else ""))
        self.check()

    def check(self) -> None:
        """Checks across fields (raise :class:`ConfigError`)."""


@dataclass(frozen=True)
class BuildConfig(Checked):
    """Options every builder takes."""

    out: str | None = option(None, "output suite folder (resumable; see --overwrite); required unless --preflight")
    overwrite: bool = option(False, "replace a different build in --out")
    smoke: bool = option(False, "whole pipeline with tiny random-weight models on CPU (no download)")
    seed: int = option(0, "suite seed; every image's seed derives from it and its ids")
    device: str | None = option(None, "default: cuda when available (each accelerate process gets its local GPU)")
    cpu_threads: int = option(1, "torch intra-op CPU threads for every model step; fixed so that the output bytes do "
                                 "not depend on the machine's thread count (recorded; a resume with another value is "
                                 "refused)", min=1)
    progress: bool = option(True, "no progress bar", flag="--no-progress")


@contextlib.contextmanager
def fixed_threads(n: int) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(n)``; the previous count is restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def threaded(run: Callable[[BuildConfig], int]) -> Callable[[BuildConfig], int]:
    """A builder's ``run(cfg)`` under :func:`fixed_threads` ``(cfg.cpu_threads)``."""
    @functools.wraps(run)
    def wrapper(cfg: BuildConfig) -> int:
        with fixed_threads(cfg.cpu_threads):
            return run(cfg)
    return wrapper


def provenance(cpu_threads: int, device: str) -> dict:
    """What decides the bytes besides the models and seeds (goes into the manifest)."""
    import torch

    out = {"cpu_intra_op_threads": int(cpu_threads), "device": str(device), "torch": torch.__version__}
    if str(device).startswith("cuda") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
        out["cuda"] = torch.version.cuda
    return out


def files_digest(root, files) -> dict:
    """``{"name": folder name, "files": n, "sha256": ...}`` of the files used from a local folder:
    sha256 over ``relative/path:sha256(content)`` lines in path order, so the record names what
    was read without the machine's path."""
    root = Path(root)
    lines = sorted(f"{Path(f).relative_to(root).as_posix()}:{sha256_file(f)}\n" for f in files)
    return {"name": root.name, "files": len(lines), "sha256": hashlib.sha256("".join(lines).encode()).hexdigest()}


def features(**dtypes: str) -> dict:
    """``datasets`` features of a builder's extra columns by dtype name (``"float32[]"``: a sequence of them)."""
    from datasets import Sequence, Value

    return {name: Sequence(Value(t[:-2])) if t.endswith("[]") else Value(t) for name, t in dtypes.items()}


def open_writer(cfg: BuildConfig, proc, **kw):
    """The suite writer of every process (the main one opens, and may replace, the build first), or
    None when the folder already holds this build."""
    from genshift.suite_format import MANIFEST, SuiteWriter

    writer = SuiteWriter(cfg.out, overwrite=cfg.overwrite, **kw) if proc.is_main else None
    proc.wait()  # the main process may have replaced an old build; then everyone opens it
    if (Path(cfg.out) / MANIFEST).is_file():  # this build (another one was refused or replaced)
        if proc.is_main:
            print(f"{cfg.out} is already built (manifest present); nothing to do")
        return None
    return writer or SuiteWriter(cfg.out, clean_incomplete=False, **kw)


def save_parquet(path: Path, table, meta: dict) -> None:
    """A checkpoint: the pyarrow ``table`` with ``meta`` (JSON values) in its schema metadata, atomically."""
    import pyarrow.parquet as pq

    table = table.replace_schema_metadata({k: json.dumps(v) for k, v in meta.items()})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def load_parquet(path: Path) -> tuple[list[dict], dict]:
    """The rows and the metadata of a :func:`save_parquet` checkpoint."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = {k.decode(): json.loads(v) for k, v in (table.schema.metadata or {}).items()}
    return table.to_pylist(), meta


def record_batch_size(work: Path, index: int, size: int) -> None:
    """The generation batch size process ``index`` ended with (after any out-of-memory back-off)."""
    atomic_write_json(work / f"batch-size-{index}.json", {"batch_size": size})


def effective_batch_sizes(work: Path) -> dict[str, int]:
    """``{process index: batch size it ended with}`` of every process that recorded one."""
    found = {int(p.stem.rsplit("-", 1)[1]): p for p in work.glob("batch-size-*.json")}
    return {str(i): json.loads(found[i].read_text())["batch_size"] for i in sorted(found)}


def wait_for(missing_fn, what: str, timeout: float, *, poll: float = 10.0) -> None:
    """Poll the file system until ``missing_fn()`` is empty; give up after ``timeout`` s without progress
    (not a collective barrier: processes may finish hours apart)."""
    last, t_last = -1, time.monotonic()
    while missing := missing_fn():
        if len(missing) != last:
            last, t_last = len(missing), time.monotonic()
            log.info("waiting for %d %s of the other processes", len(missing), what)
        elif time.monotonic() - t_last > timeout:
            raise BenchError(f"{len(missing)} {what} (e.g. {missing[0]}) did not appear within {timeout:.0f} s; a "
                             "process may have died: rerun the build to finish them")
        time.sleep(poll)


def versions(*packages: str) -> dict:
    """``{package: installed version or None}``."""
    out = dict.fromkeys(packages)
    for pkg in packages:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[pkg] = importlib.metadata.version(pkg)
    return out


@contextlib.contextmanager
def loading(what: str, hint: str, errors: tuple = (OSError, ValueError)) -> Iterator[None]:
    """Turn a failed ``from_pretrained`` into one line: "cannot load ``what``: why; ``hint``"."""
    try:
        yield
    except errors as e:
        raise BenchError(f"cannot load {what}: {first_line(e)}; {hint}") from None
