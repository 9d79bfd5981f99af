"""The result record: one JSON per (model, suite), schema version 2 (``docs/results.md``): its writer,
bounded reader and schema (pydantic, ``genshift.schema``; "Schema: what a valid result is")."""

from __future__ import annotations

import math
import platform
import re
import subprocess
import unicodedata
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from genshift.errors import CONTROL_CHARS, BenchError, IntegrityError
from genshift.fsutil import atomic_write_bytes, canonical_json, parse_json, read_limited, sha256_bytes
from genshift.hubio import SHA_RE
from genshift.identity import SOURCES, folder_name, identity_of
from genshift.schema import Count, Schema, Sha256
from genshift.schema import validate as check_schema
from genshift.suite_format import CONFIG_RE  # one set of names and limits
from genshift.suites import METRIC_FAMILIES

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

    return {
        "genshift_bench": ver("genshift-bench"), "code_version": code_version(),
        "python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
        **{pkg: ver(pkg) for pkg in ("timm", "datasets", "huggingface_hub", "numpy", "pyarrow", "pillow")},
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "torch_threads": torch.get_num_threads(),
    }


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
    """A result file's bytes, within ``MAX_RESULT_BYTES``."""
    if not path.is_file():
        raise BenchError(f"result file {str(path)!r} does not exist")
    return read_limited(path, max_bytes=MAX_RESULT_BYTES, what="result file", fix="not a result")


def load_result(path: str | Path) -> dict:
    """Read and validate a result file (one clear error for anything malformed)."""
    return parse_result(read_result_bytes(Path(path)), where=str(path))


def parse_result(raw: bytes, *, where: str) -> dict:
    """A result from the bytes of its file (for callers that also hash them), validated."""
    result = parse_json(raw, where=f"result file {where}", max_bytes=MAX_RESULT_BYTES)
    validate(result, where=where)
    return result


FIX = "a result must be written by `bench eval` (schema in docs/results.md)"


def _text_problem(text: str, *, plain: bool) -> str:
    """Why ``text`` may not be in a result (``plain``: an id or a name, shown as one), or ""."""
    if plain and CONTROL_CHARS.search(text):
        return "contains control characters"
    if plain and any(unicodedata.category(ch) == "Cf" for ch in text):  # U+202E, zero-width joiners, ...
        return "contains Unicode format characters (category Cf, e.g. U+202E); use plain text"
    if _BIDI.search(text):
        return "contains Unicode bidirectional control characters (e.g. U+202E); use plain text"
    return ""


def _plain(text: str) -> str:
    if why := _text_problem(text, plain=True):
        raise PydanticCustomError("text", why)
    return text


def _iso_time(text: str) -> str:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        raise PydanticCustomError("time", "is not an ISO 8601 time") from None
    return text


def _tree_problem(value, at: str = "") -> str:
    """The first problem of free-form JSON (metrics, run, ...) with its path, or "": keys are plain names,
    strings at most ``MAX_TEXT`` characters without bidirectional controls, numbers finite."""
    if isinstance(value, dict):
        for k, v in value.items():
            why = f"is over {MAX_NAME} characters" if len(k) > MAX_NAME else _text_problem(k, plain=True)
            if why:
                return f"key {k[:40]!r} in {at or 'it'} {why}"
            if why := _tree_problem(v, f"{at}.{k}" if at else k):
                return why
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if why := _tree_problem(v, f"{at}[{i}]"):
                return why
    elif isinstance(value, str):
        why = f"is over {MAX_TEXT} characters" if len(value) > MAX_TEXT else _text_problem(value, plain=False)
        return f"{at} {why}".strip() if why else ""
    elif isinstance(value, float) and not math.isfinite(value):
        return f"{at} is not a finite number".strip()
    return ""


def _json(value):
    if why := _tree_problem(value):
        raise PydanticCustomError("json", "{why}", {"why": why})
    return value


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME), AfterValidator(_plain)]
Tag = Annotated[str, Field(max_length=MAX_NAME), AfterValidator(_plain)]  # may be empty
Path4k = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_plain)]
Text = Annotated[str, AfterValidator(_json)]
Tree = Annotated[dict, AfterValidator(_json)]
HubSha = Annotated[str, Field(pattern=SHA_RE.pattern)]
Config = Annotated[str, Field(pattern=CONFIG_RE.pattern)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Time = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_plain), AfterValidator(_iso_time)]


class _Model(Schema):
    id: Name
    source: Literal[SOURCES]
    weights_revision: HubSha | None
    weights_sha256: Sha256 | None
    tensors_sha256: Sha256
    architecture: Name | None = None
    declared_name: Name | None = None
    tag: Tag | None = None
    num_params: Annotated[int, Field(ge=0, le=MAX_NUM_PARAMS)] | None = None
    pretrained_cfg: Tree = {}


class _Mask(Schema, extra="forbid"):
    path: Path4k | None
    sha256: Sha256 | None
    source: Literal["released", "file", "none"] = "file"


class _Suite(Schema):
    id: Name
    manifest_sha256: Sha256
    configs: Annotated[list[Config], Field(min_length=1)]
    metric_family: str
    pinned: bool
    repo_id: Name | None = None
    revision: HubSha | None = None
    suite_version: Tag | None = None
    source: Path4k | None = None
    mask: _Mask | None = None


class _Scoring(Schema, extra="forbid"):  # exactly the fields of genshift.eval.scoring.ScoringOptions
    filter: bool
    reference_config: Config | None
    reference_accuracy: Fraction | None
    n_boot: Annotated[int, Field(ge=0, le=100_000)]
    seed: Annotated[int, Field(ge=-(2**63), le=2**64)]
    confidence: Fraction
    fold_weather: bool  # null would score as false and still differ from what the result says


class _Protocol(Schema, extra="forbid"):
    topk: Annotated[int, Field(ge=1, le=1000)]
    limit_per_class: Annotated[int, Field(ge=1)] | None
    skip_bad_images: bool
    scoring: _Scoring
    # added after schema 1 shipped: present only when used (a null is refused)
    preprocess: Literal[PROTOCOL_OPTIONS["preprocess"]] = None
    decode: Literal[PROTOCOL_OPTIONS["decode"]] = None
    data_config: Literal[PROTOCOL_OPTIONS["data_config"]] = None


class _Counts(Schema, extra="forbid"):
    total: Count
    kept: Count
    predicted: Count
    skipped_bad: Count
    skipped_bad_ids: Annotated[list[Path4k], Field(max_length=MAX_SKIPPED_IDS)]


class _PredictionsFile(Schema, extra="forbid"):
    config: Config
    path: str
    rows: Count
    sha256: Sha256


class _Flags(Schema, extra="forbid"):
    unpinned_suite: bool
    construction_model: bool
    partial: bool
    skipped_bad_images: bool


class _Result(Schema, extra="forbid"):
    schema_version: int
    kind: str
    model: _Model
    data_config: Tree
    suite: _Suite
    protocol: _Protocol
    config_hash: Sha256
    run: Tree
    environment: Tree
    started_at: Time
    finished_at: Time
    counts: dict[str, _Counts]
    metrics: Tree
    predictions: list[_PredictionsFile]
    flags: _Flags
    notes: Text = ""
    analysis: Tree = {}


def validate(result, *, where: str) -> None:
    """Check every field's type and range (``docs/results.md``, "Schema"); one ``IntegrityError`` naming the
    field. Consumers (verify, the store, the board, submit) then index the result without further checks."""
    if not isinstance(result, dict):
        raise IntegrityError(f"{where}: a result is a JSON object, got {type(result).__name__}")
    if result.get("kind") != KIND:
        raise IntegrityError(f"{where}: not a genshift-bench result (kind {repr(result.get('kind'))[:40]})")
    version = result.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        why = "was written before canonical model ids" if version == 1 else "is not supported"
        raise IntegrityError(f"{where}: result schema_version {repr(version)[:20]} {why} (this genshift-bench reads "
                             f"{SCHEMA_VERSION}); re-run `bench eval` (or upgrade genshift-bench)")
    r = check_schema(_Result, result, where=where, fix=FIX)

    def bad(name: str, what: str):
        raise IntegrityError(f"{where}: field {name!r} {what}; {FIX}")

    m, s = r.model, r.suite
    if m.source == "hf-hub" and m.weights_revision is None:
        bad("model.weights_revision", "is required for Hub weights (a 40-character commit sha)")
    if m.source == "checkpoint" and m.weights_sha256 is None:
        bad("model.weights_sha256", "is required for local weights")
    if m.source != "hf-hub" and m.weights_revision is not None:
        bad("model.weights_revision", "must be null unless the weights come from the Hub")
    try:  # the id must be the canonical id of the weights the record describes, else one line naming it
        identity_of(result["model"])
    except BenchError as e:
        raise IntegrityError(f"{where}: {e}") from None
    if s.metric_family not in METRIC_FAMILIES:
        bad("suite.metric_family", f"must be one of {list(METRIC_FAMILIES)}")
    if len(set(s.configs)) != len(s.configs):
        bad("suite.configs", "lists a config twice")
    if s.mask is not None and (s.mask.sha256 is None) != (s.mask.source == "none"):
        bad("suite.mask", "has a sha256 exactly when its source is not 'none'")
    if "configs" not in r.metrics:
        bad("metrics.configs", "is missing")
    if set(r.counts) != set(s.configs):
        bad("counts", f"must have exactly the configs of suite.configs, has {sorted(r.counts)[:5]}")
    for i, e in enumerate(r.predictions):  # the only path `bench eval` writes: inside the run folder, no `..`
        if e.path != f"predictions/{e.config}.parquet":
            bad(f"predictions[{i}].path", f"must be 'predictions/{e.config}.parquet', got {e.path[:80]!r}")
    if sorted(e.config for e in r.predictions) != sorted(s.configs):
        bad("predictions", "must hold exactly one file per config in suite.configs")
