"""The result record: one JSON per (model, suite), schema version 2 (``docs/results.md``).

A result carries everything needed to trust and recompute its numbers: the model (its canonical
id and tensors digest, ``genshift.identity``; weights revision and sha256, resolved preprocessing), the suite (id, Hub repo, dataset commit, manifest
hash), the eval protocol and its hash, library and code versions, the device, timings, the
metrics with intervals, and the predictions files with their sha256. Numbers stay numbers.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import re
import unicodedata
from datetime import datetime
import subprocess
from pathlib import Path

from genshift.errors import CONTROL_CHARS, BenchError, IntegrityError
from genshift.fsutil import atomic_write_bytes, canonical_json, parse_json, read_limited, sha256_bytes
from genshift.hubio import SHA_RE
from genshift.identity import SOURCES, identity_of
from genshift.suite_format import CONFIG_RE, SHA256_RE  # one set of names and limits

SCHEMA_VERSION = 2  # 2: canonical model ids and the tensors digest (genshift.identity)
KIND = "genshift-result"
RESULT_FILE = "result.json"
# protocol options added after schema 1 shipped: present only when used, each with its values
PROTOCOL_OPTIONS = {"preprocess": ("timm", "lance-square", "lance-square-model-norm"), "decode": ("cpu", "device"),
                    # the data config of the timm a paper ran (a population's record) instead of today's timm's
                    "data_config": ("timm 0.6.12",)}
MAX_RESULT_BYTES = 5 * 2**20     # real results are tens of KiB; the leaderboard store uses the same limit
MAX_PREDICTIONS_BYTES = 512 * 2**20
MAX_TEXT = 10_000                # notes
MAX_NAME = 300                   # ids, names
FLAGS = ("unpinned_suite", "construction_model", "partial", "skipped_bad_images")
COUNT_KEYS = ("total", "kept", "predicted", "skipped_bad", "skipped_bad_ids")
MAX_SKIPPED_IDS = 100
# bidi overrides/isolates and marks: they reorder what is displayed around them (a model id shown reversed)
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# the largest ImageNet classifiers have ~10^10 parameters; a count over 10^12 is not a real model
MAX_NUM_PARAMS = 10**12


def path_slug(text: str) -> str:
    """One path component for a suite id: ASCII letters, digits and ``._-`` kept, anything else ``--``;
    never empty, ``.`` or ``..``; at most 96 characters (model folders: ``genshift.identity.folder_name``)."""
    slug = "".join(ch if (ch.isascii() and ch.isalnum()) or ch in "._-" else "--" for ch in text)[:96]
    return slug if slug.strip(".") else "_" + slug


def entry_dir(result: dict) -> str:
    """``<suite slug>/<model folder>``: the folder a result belongs in, in a run folder and in the results
    store, derived from the result's own suite id and canonical model id (one folder per model id:
    ``genshift.identity.folder_name``); an entry filed anywhere else is refused."""
    from genshift.identity import folder_name

    return f"{path_slug(result['suite']['id'])}/{folder_name(result['model']['id'])}"


def config_hash(model: dict, suite: dict, protocol: dict, data_config: dict) -> str:
    """sha256 of the canonical JSON of what defines the evaluation (not how fast it ran)."""
    ident = {
        "model": {k: model.get(k) for k in ("id", "source", "weights_revision", "weights_sha256", "tensors_sha256")},
        "suite": {k: suite.get(k) for k in ("id", "manifest_sha256", "configs", "pinned", "revision")},
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


def read_result_bytes(path: Path) -> bytes:
    """A result file's bytes, within ``MAX_RESULT_BYTES`` (bounded even if it grows after the stat)."""
    if not path.is_file():
        raise BenchError(f"result file {str(path)!r} does not exist")
    if path.stat().st_size > MAX_RESULT_BYTES:
        raise IntegrityError(f"result file {path} is larger than {MAX_RESULT_BYTES // 2**20} MiB; not a result")
    return read_limited(path, max_bytes=MAX_RESULT_BYTES, what="result file", fix="not a result")


def load_result(path: str | Path) -> dict:
    """Read and validate a result file (one clear error for anything malformed)."""
    return parse_result(read_result_bytes(Path(path)), where=str(path))


def parse_result(raw: bytes, *, where: str) -> dict:
    """A result from the bytes of its file (for callers that also hash them), validated."""
    result = parse_json(raw, where=f"result file {where}", max_bytes=MAX_RESULT_BYTES)
    validate(result, where=where)
    return result


class _Checker:
    """Collects the first schema violation with its JSON path."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, what: str):
        raise IntegrityError(f"{self.where}: {path} {what}; a result must be written by `bench eval` "
                             "(schema in docs/results.md)")

    def obj(self, v, path: str, *, required=(), optional=(), extra: bool = True) -> dict:
        if not isinstance(v, dict):
            self.fail(path, f"must be an object, got {_tname(v)}")
        for k in required:
            if k not in v:
                field_name = k if path == "result" else f"{path}.{k}"
                raise IntegrityError(f"{self.where}: field {field_name!r} is missing; a result must be written by "
                                     "`bench eval` (schema in docs/results.md)")
        if not extra:
            unknown_keys = sorted(set(v) - set(required) - set(optional))
            if unknown_keys:
                self.fail(path, f"has unknown field(s) {unknown_keys[:5]}")
        return v

    def text(self, v, path: str, *, max_len: int = MAX_NAME, none: bool = False, empty: bool = False,
             pattern: re.Pattern | None = None, control: bool = False) -> str | None:
        if v is None and none:
            return None
        if not isinstance(v, str):
            self.fail(path, f"must be a string{' or null' if none else ''}, got {_tname(v)}")
        if not v and not empty:
            self.fail(path, "must not be empty")
        if len(v) > max_len:
            self.fail(path, f"is {len(v)} characters, over the limit of {max_len}")
        if pattern is not None and not pattern.match(v):
            self.fail(path, f"{v[:80]!r} is not of the expected form")
        if not control and CONTROL_CHARS.search(v):
            self.fail(path, "contains control characters")
        if not control and any(unicodedata.category(ch) == "Cf" for ch in v):
            # format characters (U+202E, zero-width joiners, ...) make one id display as another
            self.fail(path, "contains Unicode format characters (category Cf, e.g. U+202E); use plain text")
        if _BIDI.search(v):
            self.fail(path, "contains Unicode bidirectional control characters (e.g. U+202E); use plain text")
        return v

    def integer(self, v, path: str, *, lo: int = 0, hi: int | None = None, none: bool = False) -> int | None:
        if v is None and none:
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            self.fail(path, f"must be an integer{' or null' if none else ''}, got {_tname(v)}")
        if v < lo or (hi is not None and v > hi):
            self.fail(path, f"is {v}, outside [{lo}, {hi if hi is not None else 'inf'}]")
        return v

    def number(self, v, path: str, *, lo: float | None = None, hi: float | None = None, none: bool = False):
        if v is None and none:
            return None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            self.fail(path, f"must be a finite number{' or null' if none else ''}, got {_tname(v)}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            self.fail(path, f"is {v}, outside [{lo}, {hi}]")
        return v

    def boolean(self, v, path: str) -> bool:
        if not isinstance(v, bool):
            self.fail(path, f"must be true or false, got {_tname(v)}")
        return v

    def timestamp(self, v, path: str) -> None:
        self.text(v, path, max_len=64)
        try:
            datetime.fromisoformat(v)
        except ValueError:
            self.fail(path, f"{v[:40]!r} is not an ISO 8601 time")

    def json_value(self, v, path: str) -> None:
        """Free-form JSON (metrics, analysis, run): finite numbers, bounded strings."""
        if isinstance(v, dict):
            for k, x in v.items():
                self.text(k, f"{path} key", max_len=MAX_NAME, empty=True)
                self.json_value(x, f"{path}.{k}")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                self.json_value(x, f"{path}[{i}]")
        elif isinstance(v, str):
            self.text(v, path, max_len=MAX_TEXT, empty=True, control=True)
        elif isinstance(v, float) and not math.isfinite(v):
            self.fail(path, "is not a finite number")


def _tname(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def validate(result, *, where: str) -> None:
    """Check every field's type and range (``docs/results.md``); one ``IntegrityError`` naming the field.

    After this, consumers (verify, the store, the leaderboard, submit) can index the result
    without further type checks.
    """
    from genshift.eval.scoring import ScoringOptions
    from genshift.suites import METRIC_FAMILIES

    c = _Checker(where)
    if not isinstance(result, dict):
        raise IntegrityError(f"{where}: a result is a JSON object, got {_tname(result)}")
    if result.get("kind") != KIND:
        raise IntegrityError(f"{where}: not a genshift-bench result (kind {repr(result.get('kind'))[:40]})")
    version = result.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        why = "was written before canonical model ids" if version == 1 else "is not supported"
        raise IntegrityError(f"{where}: result schema_version {repr(version)[:20]} {why} (this genshift-bench reads "
                             f"{SCHEMA_VERSION}); re-run `bench eval` (or upgrade genshift-bench)")
    c.obj(result, "result", required=("schema_version", "kind", "model", "data_config", "suite", "protocol",
                                      "config_hash", "run", "environment", "started_at", "finished_at", "counts",
                                      "metrics", "predictions", "flags"),
          optional=("notes", "analysis"), extra=False)

    m = c.obj(result["model"], "model", required=("id", "source", "weights_revision", "weights_sha256",
                                                  "tensors_sha256"))
    c.text(m["id"], "model.id")
    for k in ("architecture", "declared_name"):
        c.text(m.get(k), f"model.{k}", none=True)
    c.text(m.get("tag"), "model.tag", none=True, empty=True)
    if m["source"] not in SOURCES:
        c.fail("model.source", f"must be one of {list(SOURCES)}")
    c.text(m["weights_revision"], "model.weights_revision", none=True, pattern=SHA_RE)
    c.text(m["weights_sha256"], "model.weights_sha256", none=True, pattern=SHA256_RE)
    c.text(m["tensors_sha256"], "model.tensors_sha256", pattern=SHA256_RE)
    if m["source"] == "hf-hub" and m["weights_revision"] is None:
        c.fail("model.weights_revision", "is required for Hub weights (a 40-character commit sha)")
    if m["source"] == "checkpoint" and m["weights_sha256"] is None:
        c.fail("model.weights_sha256", "is required for local weights")
    if m["source"] != "hf-hub" and m["weights_revision"] is not None:
        c.fail("model.weights_revision", "must be null unless the weights come from the Hub")
    c.integer(m.get("num_params"), "model.num_params", hi=MAX_NUM_PARAMS, none=True)
    c.json_value(c.obj(m.get("pretrained_cfg", {}), "model.pretrained_cfg"), "model.pretrained_cfg")
    try:  # the id must be the canonical id of the weights the record describes, else one line naming it
        identity_of(m)
    except BenchError as e:
        raise IntegrityError(f"{where}: {e}") from None

    dc = c.obj(result["data_config"], "data_config")
    c.json_value(dc, "data_config")

    s = c.obj(result["suite"], "suite", required=("id", "manifest_sha256", "configs", "metric_family", "pinned"))
    c.text(s["id"], "suite.id")
    c.text(s["manifest_sha256"], "suite.manifest_sha256", pattern=SHA256_RE)
    c.boolean(s["pinned"], "suite.pinned")
    c.text(s.get("repo_id"), "suite.repo_id", none=True)
    c.text(s.get("revision"), "suite.revision", none=True, pattern=SHA_RE)
    c.text(s.get("suite_version"), "suite.suite_version", none=True, empty=True)
    c.text(s.get("source"), "suite.source", none=True, max_len=4096)
    if s["metric_family"] not in METRIC_FAMILIES:
        c.fail("suite.metric_family", f"must be one of {list(METRIC_FAMILIES)}")
    if not isinstance(s["configs"], list) or not s["configs"]:
        c.fail("suite.configs", "must be a non-empty list of config names")
    for i, name in enumerate(s["configs"]):
        c.text(name, f"suite.configs[{i}]", pattern=CONFIG_RE)
    if len(set(s["configs"])) != len(s["configs"]):
        c.fail("suite.configs", "lists a config twice")
    mask = s.get("mask")
    if mask is not None:
        c.obj(mask, "suite.mask", required=("path", "sha256"), optional=("source",), extra=False)
        source = mask.get("source", "file")
        if source not in ("released", "file", "none"):
            c.fail("suite.mask.source", "must be one of ['released', 'file', 'none']")
        c.text(mask["path"], "suite.mask.path", max_len=4096, none=True)
        c.text(mask["sha256"], "suite.mask.sha256", pattern=SHA256_RE, none=source == "none")
        if (mask["sha256"] is None) != (source == "none"):
            c.fail("suite.mask", "has a sha256 exactly when its source is not 'none'")

    p = c.obj(result["protocol"], "protocol", required=("topk", "limit_per_class", "skip_bad_images", "scoring"),
              optional=PROTOCOL_OPTIONS, extra=False)
    c.integer(p["topk"], "protocol.topk", lo=1, hi=1000)
    c.integer(p["limit_per_class"], "protocol.limit_per_class", lo=1, none=True)
    c.boolean(p["skip_bad_images"], "protocol.skip_bad_images")
    names = [f.name for f in dataclasses.fields(ScoringOptions)]
    sc = c.obj(p["scoring"], "protocol.scoring", required=names, extra=False)
    c.boolean(sc["filter"], "protocol.scoring.filter")
    c.text(sc["reference_config"], "protocol.scoring.reference_config", none=True, pattern=CONFIG_RE)
    c.number(sc["reference_accuracy"], "protocol.scoring.reference_accuracy", lo=0, hi=1, none=True)
    c.integer(sc["n_boot"], "protocol.scoring.n_boot", hi=100_000)
    c.integer(sc["seed"], "protocol.scoring.seed", lo=-(2**63), hi=2**64)
    c.number(sc["confidence"], "protocol.scoring.confidence", lo=0, hi=1)
    # a switch must be a boolean: null would score as false and still differ from what the result says it is
    c.boolean(sc["fold_weather"], "protocol.scoring.fold_weather")
    for k in set(names) - {"filter", "reference_config", "reference_accuracy", "n_boot", "seed", "confidence",
                           "fold_weather"}:
        c.json_value(sc[k], f"protocol.scoring.{k}")  # an option added later without its own check: a JSON value
    for k, allowed in PROTOCOL_OPTIONS.items():
        if k in p and p[k] not in allowed:
            c.fail(f"protocol.{k}", f"must be one of {list(allowed)}")

    c.text(result["config_hash"], "config_hash", pattern=SHA256_RE)
    c.json_value(c.obj(result["run"], "run"), "run")
    c.json_value(c.obj(result["environment"], "environment"), "environment")
    c.timestamp(result["started_at"], "started_at")
    c.timestamp(result["finished_at"], "finished_at")
    c.text(result.get("notes", ""), "notes", max_len=MAX_TEXT, empty=True, control=True)
    c.json_value(c.obj(result.get("analysis", {}), "analysis"), "analysis")

    configs = s["configs"]
    counts = c.obj(result["counts"], "counts", required=configs, extra=False)
    for cfg in configs:
        n = c.obj(counts[cfg], f"counts.{cfg}", required=COUNT_KEYS, extra=False)
        for k in COUNT_KEYS[:-1]:
            c.integer(n[k], f"counts.{cfg}.{k}")
        ids = n["skipped_bad_ids"]
        if not isinstance(ids, list) or len(ids) > MAX_SKIPPED_IDS:
            c.fail(f"counts.{cfg}.skipped_bad_ids", f"must be a list of at most {MAX_SKIPPED_IDS} image ids")
        for i, iid in enumerate(ids):
            c.text(iid, f"counts.{cfg}.skipped_bad_ids[{i}]", max_len=4096)

    metrics = c.obj(result["metrics"], "metrics", required=("configs",))
    c.json_value(metrics, "metrics")

    preds = result["predictions"]
    if not isinstance(preds, list):
        c.fail("predictions", f"must be a list, got {_tname(preds)}")
    for i, e in enumerate(preds):
        c.obj(e, f"predictions[{i}]", required=("config", "path", "rows", "sha256"), extra=False)
        c.text(e["config"], f"predictions[{i}].config", pattern=CONFIG_RE)
        # the only path `bench eval` writes: relative, inside the run folder, no `..`
        if e["path"] != f"predictions/{e['config']}.parquet":
            c.fail(f"predictions[{i}].path", f"must be 'predictions/{e['config']}.parquet', got {str(e['path'])[:80]!r}")
        c.integer(e["rows"], f"predictions[{i}].rows")
        c.text(e["sha256"], f"predictions[{i}].sha256", pattern=SHA256_RE)
    if sorted(e["config"] for e in preds) != sorted(configs):
        c.fail("predictions", "must hold exactly one file per config in suite.configs")

    flags = c.obj(result["flags"], "flags", required=FLAGS, extra=False)
    for k in FLAGS:
        c.boolean(flags[k], f"flags.{k}")
