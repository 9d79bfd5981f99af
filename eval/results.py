"""The result record: one JSON per (model, suite), schema version 1 (``docs/results.md``).

A result carries everything needed to trust and recompute its numbers: the model (id, weights
revision and sha256, resolved preprocessing), the suite (id, Hub repo, dataset commit, manifest
hash), the eval protocol and its hash, library and code versions, the device, timings, the
metrics with intervals, and the predictions files with their sha256. Numbers stay numbers.
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

from benchmark.errors import BenchError, IntegrityError
from benchmark.fsutil import atomic_write_bytes, canonical_json, sha256_bytes

SCHEMA_VERSION = 1
KIND = "genshift-result"
RESULT_FILE = "result.json"
REQUIRED = {
    "schema_version": int, "kind": str, "model": dict, "data_config": dict, "suite": dict, "protocol": dict,
    "config_hash": str, "run": dict, "environment": dict, "started_at": str, "finished_at": str,
    "counts": dict, "metrics": dict, "predictions": list, "flags": dict,
}
MAX_RESULT_BYTES = 20 * 1024 * 1024


def config_hash(model: dict, suite: dict, protocol: dict, data_config: dict) -> str:
    """sha256 of the canonical JSON of what defines the evaluation (not how fast it ran)."""
    ident = {
        "model": {k: model.get(k) for k in ("id", "weights_revision", "weights_sha256")},
        "suite": {k: suite.get(k) for k in ("id", "manifest_sha256", "configs")},
        "protocol": protocol,
        "data_config": data_config,
    }
    return sha256_bytes(canonical_json(ident))


def environment() -> dict:
    """Library versions, code version, Python and accelerator flags."""
    import importlib.metadata as md

    import torch

    def ver(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    env = {
        "genshift_bench": ver("genshift-bench"),
        "code_version": code_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "timm": ver("timm"), "datasets": ver("datasets"), "huggingface_hub": ver("huggingface_hub"),
        "numpy": ver("numpy"), "pyarrow": ver("pyarrow"), "pillow": ver("pillow"),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "torch_threads": torch.get_num_threads(),
    }
    return env


def code_version() -> str | None:
    """git commit of the source tree bench runs from (``+dirty`` if modified), else None."""
    here = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


def write_result(path: str | Path, result: dict) -> str:
    """Validate and write atomically; returns the file's sha256."""
    validate(result, where=str(path))
    data = canonical_json(result)
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def load_result(path: str | Path) -> dict:
    """Read and validate a result file (one clear error for anything malformed)."""
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"result file {str(path)!r} does not exist")
    if path.stat().st_size > MAX_RESULT_BYTES:
        raise IntegrityError(f"result file {path} is larger than {MAX_RESULT_BYTES // 2**20} MiB; not a result")
    return parse_result(path.read_bytes(), where=str(path))


def parse_result(raw: bytes, *, where: str) -> dict:
    """A result from the bytes of its file (for callers that also hash them), validated."""
    try:
        result = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrityError(f"result file {where} is not valid JSON ({e})") from None
    validate(result, where=where)
    return result


def validate(result, *, where: str) -> None:
    if not isinstance(result, dict):
        raise IntegrityError(f"{where}: a result is a JSON object, got {type(result).__name__}")
    if result.get("kind") != KIND:
        raise IntegrityError(f"{where}: not a genshift-bench result (kind {result.get('kind')!r})")
    version = result.get("schema_version")
    if version != SCHEMA_VERSION:
        raise IntegrityError(f"{where}: result schema_version {version!r} is not supported (this genshift-bench "
                             f"reads {SCHEMA_VERSION}); upgrade genshift-bench or re-run the eval")
    for key, typ in REQUIRED.items():
        if not isinstance(result.get(key), typ):
            raise IntegrityError(f"{where}: field {key!r} is missing or not a {typ.__name__}")
    for p in result["predictions"]:
        if not (isinstance(p, dict) and isinstance(p.get("config"), str) and isinstance(p.get("path"), str)
                and isinstance(p.get("sha256"), str) and isinstance(p.get("rows"), int)):
            raise IntegrityError(f"{where}: malformed predictions entry {p!r}")
        if p["path"].startswith("/") or ".." in p["path"].split("/"):
            raise IntegrityError(f"{where}: predictions path {p['path']!r} must be relative to the result file")
    for key in ("id", "manifest_sha256", "configs", "metric_family"):
        if key not in result["suite"]:
            raise IntegrityError(f"{where}: suite.{key} is missing")
    if "id" not in result["model"]:
        raise IntegrityError(f"{where}: model.id is missing")
