"""Compile a model once per machine: ahead-of-time packages in a persistent, content-keyed cache.

A cold ``torch.compile`` of a timm model costs tens of seconds on CPU, so short runs used to stay
eager. Here the model's forward pass at one fixed input shape is exported (``torch.export``) and
compiled ahead of time by AOTInductor into a single ``.pt2`` package (the documented
``torch._inductor.aoti_compile_and_package`` / ``aoti_load_package`` pair). Packages live in the
user's cache folder (``$HF_HOME/genshift/compiled``, or ``$GENSHIFT_COMPILE_CACHE``), shared by
every run, sweep and process on the machine; loading one takes a fraction of a second.

The key is the sha256 of everything the compiled code depends on: the model's code and structure
(class and ``repr``), every weight and buffer (the package embeds them as constants), the input
shape, dtype and memory format, the device type and the CPU's vector ISA (or the GPU's compute
capability), the intra-op thread count (the generated kernels' parallel loops are laid out for it,
and the reduction order with them), torch's version and this module's format version. Two different models, weights or
shapes can never share a package.

Concurrency: a per-key file lock lets one process compile while the others wait for it and then
load its package; a package is written under a temporary name and renamed, so a reader never sees
a half-written file. A package that fails to load is deleted and compiled again. The folder is
bounded (``GENSHIFT_COMPILE_CACHE_GB``, default 20 GiB): after each write the least recently used
packages are removed until it fits.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from genshift.fsutil import cache_root, canonical_json, sha256_bytes

log = logging.getLogger(__name__)
FORMAT = "aoti-2"  # 2: the intra-op thread count is part of the key
DEFAULT_LIMIT_GB = 20.0


def cache_dir() -> Path:
    if os.environ.get("GENSHIFT_COMPILE_CACHE"):
        return Path(os.environ["GENSHIFT_COMPILE_CACHE"])
    return cache_root() / "compiled"


def _limit_bytes() -> int:
    raw = os.environ.get("GENSHIFT_COMPILE_CACHE_GB", "")
    try:
        gb = float(raw) if raw else DEFAULT_LIMIT_GB
    except ValueError:
        gb = DEFAULT_LIMIT_GB
    return int(max(gb, 0.0) * 2**30)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer: name, dtype, shape and bytes."""
    h = hashlib.sha256()
    for name, t in model.state_dict(keep_vars=False).items():
        t = t.detach()
        h.update(canonical_json([name, str(t.dtype), list(t.shape)]))
        if t.device.type == "meta":
            raise ValueError(f"weight {name} is on the meta device; load the weights before compiling")
        # a byte view of the tensor (bf16 and friends have no numpy dtype)
        h.update(t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _device_fingerprint(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"type": "cuda", "capability": list(torch.cuda.get_device_capability(device)),
                "cuda": torch.version.cuda}
    return {"type": device.type, "isa": torch.backends.cpu.get_cpu_capability()}


def package_key(model: torch.nn.Module, example: torch.Tensor, *, weights: str | None = None) -> str:
    """The content key of ``model``'s package for inputs shaped like ``example``."""
    cls = type(model)
    return sha256_bytes(canonical_json({
        "format": FORMAT, "torch": torch.__version__,
        "model": f"{cls.__module__}.{cls.__qualname__}", "structure": sha256_bytes(repr(model).encode()),
        "weights": weights or weights_digest(model),
        "input": {"shape": list(example.shape), "dtype": str(example.dtype),
                  "channels_last": example.is_contiguous(memory_format=torch.channels_last)
                  and not example.is_contiguous()},
        "device": _device_fingerprint(example.device),
        "intra_op_threads": torch.get_num_threads() if example.device.type == "cpu" else None,
    }))


def package_path(key: str) -> Path:
    return cache_dir() / f"{key}.pt2"


@dataclass
class Compiled:
    """A loaded package and how it was obtained (the evidence a run records)."""

    fn: object
    key: str
    source: str          # "cache": loaded an existing package; "compiled": compiled and stored it now
    seconds: float       # wall time to obtain ``fn`` (lock wait + export + compile + load)


def _load(path: Path):
    from torch._inductor import aoti_load_package

    fn = aoti_load_package(str(path))
    os.utime(path)  # least recently used eviction reads mtime
    return fn


def _compile_to(model: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
    from torch._inductor import aoti_compile_and_package

    with torch.no_grad():
        exported = torch.export.export(model, (example,))
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")  # AOTInductor wants a .pt2 name
    try:
        # freezing: weights as constants, conv-bn folding and prepacked kernels (as the JIT path does)
        aoti_compile_and_package(exported, package_path=str(tmp), inductor_configs={"freezing": True})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def evict(limit: int | None = None, *, keep: Path | None = None) -> list[Path]:
    """Remove least recently used packages until the folder fits ``limit`` bytes; never ``keep``."""
    limit = _limit_bytes() if limit is None else limit
    root = cache_dir()
    if not root.is_dir():
        return []
    files = []
    for p in root.glob("[!.]*.pt2"):  # not the temporary files of a compile in progress
        try:
            st = p.stat()
        except FileNotFoundError:  # another process evicted it
            continue
        files.append((st.st_mtime, st.st_size, p))
    total = sum(s for _, s, _ in files)
    removed = []
    for _, size, p in sorted(files, key=lambda f: f[0]):
        if total <= limit:
            break
        if keep is not None and p == keep:
            continue
        p.unlink(missing_ok=True)
        total -= size
        removed.append(p)
    return removed


def cached(model: torch.nn.Module, example: torch.Tensor, *, weights: str | None = None) -> bool:
    """Whether a package for this model and input shape is already on this machine."""
    return package_path(package_key(model, example, weights=weights)).is_file()


def load_or_compile(model: torch.nn.Module, example: torch.Tensor, *, weights: str | None = None) -> Compiled:
    """The compiled forward pass of ``model`` at ``example``'s shape: from the cache, or compiled once."""
    from filelock import FileLock

    start = time.perf_counter()
    key = package_key(model, example, weights=weights)
    path = package_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_suffix(".lock"))):
        if path.is_file():
            try:
                fn = _load(path)
                return Compiled(fn, key, "cache", time.perf_counter() - start)
            except Exception as e:  # noqa: BLE001 - a damaged package is rebuilt, never trusted
                log.warning("compiled package %s could not be loaded (%s: %s); compiling again",
                            path.name, type(e).__name__, e)
                path.unlink(missing_ok=True)
        log.info("compiling %s ahead of time for inputs %s (once per machine)", type(model).__name__,
                 tuple(example.shape))
        _compile_to(model, example, path)
        fn = _load(path)
    evict(keep=path)
    return Compiled(fn, key, "compiled", time.perf_counter() - start)
