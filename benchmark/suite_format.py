"""The suite format, version 1: row schema, shard names, the manifest and its verification.

``docs/format.md`` is the authoritative description; this module is its implementation. In short::

    <suite>/
      README.md                                  dataset card (YAML: one config per shift / family)
      manifest.json                              files with size + sha256, row counts, provenance
      data/<config>/test-00000-of-00004.parquet  rows, written with ``datasets`` (features kept)

The manifest is written last, so a folder without one is an unfinished build.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
from datasets import ClassLabel, Features, Image, Value

from benchmark import imagenet
from benchmark.errors import BenchError, IntegrityError, unknown
from benchmark.fsutil import canonical_json, sha256_bytes, sha256_file

FORMAT_NAME = "genshift-suite"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CARD = "README.md"
BUILD_STATE = "build.json"  # present while (and after) a builder writes into a folder
SPLIT = "test"
CONFIG_RE = re.compile(r"^[a-z0-9][a-z0-9_\-]{0,63}$")
SHARD_RE = re.compile(r"^test-(\d{5})-of-(\d{5})\.parquet$")
# Columns every row has. Builders add free provenance columns next to them.
REQUIRED_COLUMNS = ("image", "label", "image_id", "config", "keep", "pair_id")


def base_features() -> Features:
    """Features of the required columns. ``label`` is a ClassLabel over the 1000 wnids."""
    return Features({
        "image": Image(),
        "label": ClassLabel(names=list(imagenet.wnids())),
        "image_id": Value("string"),
        "config": Value("string"),
        "keep": Value("bool"),
        "pair_id": Value("string"),
    })


def suite_features(extra: Features | dict | None = None) -> Features:
    """The required features followed by ``extra`` provenance columns."""
    feats = base_features()
    for name, feat in (extra or {}).items():
        if name in feats:
            raise ValueError(f"provenance column {name!r} clashes with a required column")
        feats[name] = feat
    return feats


def rows_digest(image_ids, labels, keeps) -> str:
    """Digest of a config's row identity (format 1.1): sha256 over its ``(image_id, label, keep)``
    rows in ``image_id`` order, one compact JSON array per line::

        ["img-000",17,true]\n["img-001",3,false]\n...

    ``image_id`` order is code-point order (the same as UTF-8 byte order). A predictions file
    holds the same three columns, so a result can be checked against the suite's manifest alone
    (no images): dropped, duplicated or relabelled rows change the digest.
    """
    ids = [str(i) for i in image_ids]
    labels = [int(x) for x in labels]
    keeps = [bool(k) for k in keeps]
    if not (len(ids) == len(labels) == len(keeps)):
        raise ValueError("image_ids, labels and keeps differ in length")
    h = hashlib.sha256()
    for i in sorted(range(len(ids)), key=ids.__getitem__):
        h.update(json.dumps([ids[i], labels[i], keeps[i]], ensure_ascii=False, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def shard_name(config: str, index: int, num_shards: int) -> str:
    """Relative path of one shard: ``data/<config>/test-00003-of-00008.parquet``."""
    check_config_name(config)
    if not (0 <= index < num_shards <= 99999):
        raise ValueError(f"shard index {index} out of range for {num_shards} shards")
    return f"data/{config}/{SPLIT}-{index:05d}-of-{num_shards:05d}.parquet"


def check_config_name(config: str) -> str:
    if not CONFIG_RE.match(config):
        raise BenchError(f"config name {config!r} is not valid: use lower-case letters, digits, '_' or '-' "
                         "(at most 64 characters, starting with a letter or digit)")
    return config


def read_parquet_features(path: str | Path) -> Features:
    """The ``datasets`` features embedded in a parquet file's metadata."""
    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(b"huggingface")
    if raw is None:
        raise IntegrityError(f"{path}: parquet file has no 'huggingface' schema metadata; suites must be "
                             "written with datasets (benchmark.writer.SuiteWriter) so features survive")
    return Features.from_dict(json.loads(raw)["info"]["features"])


def check_features(features: Features, *, where: str) -> None:
    """Raise unless ``features`` holds the required columns with the required types."""
    missing = [c for c in REQUIRED_COLUMNS if c not in features]
    if missing:
        raise IntegrityError(f"{where}: missing required column(s) {', '.join(missing)}; see docs/format.md")
    base = base_features()
    for col in REQUIRED_COLUMNS:
        if features[col] != base[col]:
            raise IntegrityError(f"{where}: column {col!r} has type {features[col]!r}, expected {base[col]!r}")


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ConfigInfo:
    name: str
    rows: int
    kept: int
    files: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    """The parsed ``manifest.json`` of a suite.

    ``sha256`` is the hash of the manifest file's bytes: results record it, so any change to any
    data file (through its recorded hash) changes it.
    """

    suite_id: str
    suite_version: str
    configs: dict[str, ConfigInfo]
    files: dict[str, ManifestFile]
    features: dict
    generator: dict
    sha256: str
    raw: dict

    def datasets_features(self):
        """The rows' ``datasets.Features`` in column order."""
        feats = Features.from_dict(self.features)
        order = self.raw.get("columns") or list(feats)
        return Features({c: feats[c] for c in order})

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str) -> "Manifest":
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise IntegrityError(f"{where}: manifest is not valid JSON ({e}); re-download or rebuild the suite") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise IntegrityError(f"{where}: not a {FORMAT_NAME} manifest (field 'format' is "
                                 f"{raw.get('format') if isinstance(raw, dict) else None!r})")
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            raise IntegrityError(f"{where}: manifest format_version {version!r} is not supported by this "
                                 f"genshift-bench (supports {FORMAT_VERSION}); upgrade genshift-bench or use a "
                                 "suite revision written in format 1")
        try:
            files = {p: ManifestFile(p, int(f["size"]), str(f["sha256"])) for p, f in raw["files"].items()}
            configs = {
                name: ConfigInfo(name, int(c["rows"]), int(c["kept"]), tuple(c["files"]))
                for name, c in raw["configs"].items()
            }
            suite_id, suite_version = str(raw["suite_id"]), str(raw.get("suite_version", "1"))
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"{where}: manifest is malformed ({type(e).__name__}: {e}); see docs/format.md") from None
        for c in configs.values():
            for p in c.files:
                if p not in files:
                    raise IntegrityError(f"{where}: config {c.name!r} lists {p}, which is not in the manifest's files")
        return cls(suite_id=suite_id, suite_version=suite_version, configs=configs, files=files,
                   features=raw.get("features", {}), generator=raw.get("generator", {}),
                   sha256=sha256_bytes(data), raw=raw)

    @classmethod
    def load(cls, root: str | Path) -> "Manifest":
        path = Path(root) / MANIFEST
        if not path.is_file():
            hint = ("the build did not finish; rerun the same build command to resume"
                    if (Path(root) / BUILD_STATE).exists() else
                    "it is not a suite folder in format 1 (see docs/format.md)")
            raise IntegrityError(f"{str(root)!r} has no {MANIFEST}: {hint}")
        return cls.from_bytes(path.read_bytes(), where=str(path))

    def config(self, name: str) -> ConfigInfo:
        try:
            return self.configs[name]
        except KeyError:
            raise unknown("config", name, self.configs, hint=f"Configs of {self.suite_id}: "
                          f"{', '.join(sorted(self.configs))}.") from None


def build_manifest(root: Path, *, suite_id: str, suite_version: str, configs: dict[str, dict],
                   features: Features, generator: dict) -> bytes:
    """Hash every shard under ``root`` and return the manifest's bytes (canonical JSON).

    ``configs`` maps each config to ``{"rows": int, "kept": int, "files": [relative paths]}``.
    """
    files = {}
    for name in sorted(configs):
        for rel in configs[name]["files"]:
            p = root / rel
            files[rel] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "suite_id": suite_id,
        "suite_version": suite_version,
        "split": SPLIT,
        "configs": {n: {"rows": c["rows"], "kept": c["kept"], "files": sorted(c["files"])}
                    for n, c in sorted(configs.items())},
        "files": files,
        "features": features.to_dict(),
        "columns": list(features),  # column order (JSON object keys are sorted)
        "generator": generator,
    }
    return canonical_json(manifest)


def verify_files(root: str | Path, manifest: Manifest, configs: list[str] | None = None, *,
                 redownload_hint: str | None = None) -> int:
    """Check size and sha256 of every file of ``configs`` (all by default). Returns bytes checked.

    Raises ``IntegrityError`` naming the first file that is missing or differs.
    """
    root = Path(root)
    names = list(manifest.configs) if configs is None else configs
    hint = redownload_hint or "rebuild the suite or restore the file"
    checked = 0
    for name in names:
        for rel in manifest.config(name).files:
            entry = manifest.files[rel]
            p = root / rel
            if not p.is_file():
                raise IntegrityError(f"{rel} is listed in the manifest but missing from {root}; {hint}")
            size = p.stat().st_size
            if size != entry.size:
                raise IntegrityError(f"{rel} has {size} bytes, the manifest says {entry.size}; {hint}")
            digest = sha256_file(p)
            if digest != entry.sha256:
                raise IntegrityError(f"{rel} sha256 {digest[:12]}… does not match the manifest "
                                     f"({entry.sha256[:12]}…); {hint}")
            checked += size
    return checked
