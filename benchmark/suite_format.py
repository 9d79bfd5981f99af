"""The suite format, version 1.1 (``docs/format.md``, the authoritative description): row schema, shard names, the
manifest and its checks; :class:`SuiteWriter`, the writer of every builder and of ``bench import-folder`` (section 3:
shard by shard, each atomic and resumable, the manifest last); :class:`LocalSuite`, the one validation layer for suites
read from a local folder (every file checked before any model is loaded; rows stream by row group). Everything read
from a suite is hostile until checked (section 4.2); each error is one :class:`~genshift.errors.IntegrityError` line."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field

from genshift import fsutil, imagenet
from genshift.errors import BenchError, IntegrityError, one_line, unknown
from genshift.fsutil import StatKey, canonical_json, load_yaml, parse_json, read_limited, sha256_bytes, sha256_file
from genshift.schema import Count, Schema, Sha256, validate

if TYPE_CHECKING:
    from datasets import Features

log = logging.getLogger(__name__)
FORMAT_NAME = "genshift-suite"
# a string: readers of format 1 compare with the integer 1 and refuse it (docs/format.md section 8)
FORMAT_VERSION = "1.1"
READABLE_VERSIONS = (1, "1.1")
MANIFEST = "manifest.json"
CARD = "README.md"
EVAL_YAML = "eval.yaml"  # the Hub reads a benchmark's tasks from it (genshift.hub)
BUILD_STATE = "build.json"  # present while (and after) a builder writes into a folder
SPLIT = "test"
# The one pattern for every name that becomes a path component: suite id, config, split.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_\-]{0,63}$")
CONFIG_RE = NAME_RE
SHARD_RE = re.compile(r"^test-(\d{5})-of-(\d{5})\.parquet$")
SHARD_PATH_RE = re.compile(r"^data/([a-z0-9][a-z0-9_\-]{0,63})/test-(\d{5})-of-(\d{5})\.parquet$")
VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+\-]{0,63}$")
MAX_MANIFEST_BYTES = 16 << 20  # a 1.2M-row suite's manifest is well under 1 MB
IMAGE_ROWS_PER_GROUP = 100  # parquet row group = one streaming unit for eval
MAX_STATE_BYTES = 16 << 20  # build.json: the settings and features of a build
# Columns every row has. Builders add free provenance columns next to them.
REQUIRED_COLUMNS = ("image", "label", "image_id", "config", "keep", "pair_id")


def base_features() -> Features:
    """Features of the required columns. ``label`` is a ClassLabel over the 1000 wnids."""
    from datasets import ClassLabel, Features, Image, Value  # here: the leaderboard reads results without it

    return Features({"image": Image(), "label": ClassLabel(names=list(imagenet.wnids())), "image_id": Value("string"),
                     "config": Value("string"), "keep": Value("bool"), "pair_id": Value("string")})


def rows_digest(image_ids, labels, keeps) -> str:
    """A config's rows digest (``docs/format.md`` section 4.1): sha256 over its ``(image_id, label,
    keep)`` rows in ``image_id`` (code-point) order, one compact JSON array per line. The reference
    implementation of :func:`rows_digest_table`."""
    rows = [[str(i), int(x), bool(k)] for i, x, k in zip(image_ids, labels, keeps, strict=True)]
    h = hashlib.sha256()
    for row in sorted(rows, key=lambda r: r[0]):
        h.update((json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
    return h.hexdigest()


def rows_digest_table(table: pa.Table) -> str:
    """:func:`rows_digest` of a table's ``image_id``, ``label`` and ``keep`` columns, with Arrow kernels
    (``benchmarks/rows_check_speed.py``). Arrow's stable sort of strings by UTF-8 bytes is code-point order."""
    return _digest_sorted(*_sorted_rows(table))


def _sorted_rows(table: pa.Table) -> tuple[pa.Array, pa.Array, pa.Array]:
    """``image_id`` (large_string), ``label`` (int64) and ``keep`` in ``image_id`` order."""
    cols = {c: table[c].combine_chunks() if isinstance(table[c], pa.ChunkedArray) else table[c]
            for c in ("image_id", "label", "keep")}
    if any(a.null_count for a in cols.values()):
        raise ValueError("image_id, label and keep must not be null")
    ids = cols["image_id"].cast(pa.large_string())
    order = pc.sort_indices(ids)
    return ids.take(order), cols["label"].cast(pa.int64()).take(order), cols["keep"].take(order)


def _digest_sorted(ids: pa.Array, labels: pa.Array, keeps: pa.Array) -> str:
    escape = pc.match_substring_regex(ids, r'["\\\x00-\x1f]')  # characters JSON escapes
    if pc.any(escape).as_py():  # rare: quote, backslash or control characters -> json's own escapes
        fixed = [json.dumps(v, ensure_ascii=False)[1:-1] if e else v
                 for v, e in zip(ids.to_pylist(), escape.to_pylist())]
        ids = pa.array(fixed, pa.large_string())
    lit = lambda text: pa.scalar(text, pa.large_string())
    lines = pc.binary_join_element_wise(lit('["'), ids, lit('",'), labels.cast(pa.large_string()), lit(","),
                                        pc.if_else(keeps, lit("true"), lit("false")), lit("]\n"), lit(""))
    h = hashlib.sha256()
    if len(lines):
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset:lines.offset + len(lines) + 1]
        h.update(memoryview(lines.buffers()[2])[int(offsets[0]):int(offsets[-1])])
    return h.hexdigest()


def shard_name(config: str, index: int, num_shards: int) -> str:
    """Relative path of one shard: ``data/<config>/test-00003-of-00008.parquet``."""
    check_name(config)
    if not (0 <= index < num_shards <= 99999):
        raise ValueError(f"shard index {index} out of range for {num_shards} shards")
    return f"data/{config}/{SPLIT}-{index:05d}-of-{num_shards:05d}.parquet"


def check_name(value, kind: str = "config name", *, where: str = "", error=BenchError) -> str:
    """Check a name that becomes a path component (suite id, config, split) against :data:`NAME_RE`."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        shown = repr(value) if isinstance(value, str) and len(value) <= 80 else f"{str(value)[:60]!r}…"
        raise error(f"{where + ': ' if where else ''}{kind} {shown} is not valid: use lower-case letters, digits, "
                    "'_' or '-' (at most 64 characters, starting with a letter or digit)")
    return value


def _features_of(metadata: dict | None, where: str) -> dict:
    """The ``datasets`` features dict in a parquet schema's ``huggingface`` metadata, parsed with limits and kept
    a plain dict: ``Features`` of a hostile dict can cost any memory (``ClassLabel(num_classes=10**12)``)."""
    raw = (metadata or {}).get(b"huggingface")
    if raw is None:
        raise IntegrityError(f"{where}: parquet file has no 'huggingface' schema metadata; suites must be "
                             "written by genshift.suite_format.SuiteWriter (or with datasets) so features survive")
    info = parse_json(raw, what="'huggingface' parquet metadata", where=where, max_bytes=MAX_MANIFEST_BYTES)
    inner = info.get("info") if isinstance(info, dict) else None
    features = inner.get("features") if isinstance(inner, dict) else None
    if not isinstance(features, dict):
        raise IntegrityError(f"{where}: the 'huggingface' parquet metadata holds no features; re-download or "
                             "rebuild the suite")
    return features


@functools.lru_cache(maxsize=1)
def _base_feature_dict() -> dict:
    return base_features().to_dict()


def check_features(features: dict, *, where: str) -> None:
    """Raise unless a features dict holds the required columns with the required types."""
    if missing := [c for c in REQUIRED_COLUMNS if c not in features]:
        raise IntegrityError(f"{where}: missing required column(s) {', '.join(missing)}; see docs/format.md")
    base = _base_feature_dict()
    for col in REQUIRED_COLUMNS:
        if features[col] != base[col]:
            raise IntegrityError(f"{where}: column {col!r} has feature {str(features[col])[:80]}, expected "
                                 f"{str(base[col])[:80]}; rebuild the suite with genshift.suite_format.SuiteWriter")


@dataclass(frozen=True)
class ConfigInfo:
    name: str
    rows: int
    kept: int
    files: tuple[str, ...]
    rows_digest: str | None = None  # format 1.1; None in a format-1 manifest (LocalSuite computes it)


def _bad(where: str, what: str) -> IntegrityError:
    return IntegrityError(f"{where}: {what}; {MANIFEST_FIX}")


MANIFEST_FIX = ("the manifest was not written by genshift-bench or was edited (re-download or rebuild the suite, "
                "see docs/format.md)")


class ManifestFile(Schema):
    size: Count
    sha256: Sha256


class _ConfigEntry(Schema):
    rows: Count
    kept: Count
    files: list[str] = Field(min_length=1)
    rows_digest: Sha256 | None = None  # required from format 1.1 on


class _ManifestSchema(Schema):
    """``manifest.json`` (docs/format.md section 4); ``format`` and ``format_version`` are checked first."""

    suite_id: str
    suite_version: Annotated[str, Field(pattern=VERSION_RE.pattern)] = "1"
    split: Literal["test"] = SPLIT
    files: dict[str, ManifestFile]
    configs: dict[str, _ConfigEntry] = Field(min_length=1)
    features: dict
    columns: list | None = None
    generator: dict = Field(default_factory=dict)


def _config_info(name: str, c: _ConfigEntry, version, files: dict, where: str) -> ConfigInfo:
    """A config's entry checked against the manifest's files: its own shards, one complete set, counts."""
    check_name(name, "config name", where=where, error=IntegrityError)
    at = f"{where}: config {name!r}"
    if c.kept > c.rows:
        raise _bad(at, f"kept ({c.kept}) is larger than rows ({c.rows})")
    if len(set(c.files)) != len(c.files):
        raise _bad(at, "lists a shard twice")
    shards = set()
    for rel in c.files:
        m = SHARD_PATH_RE.fullmatch(rel)
        if not m or m.group(1) != name:
            raise _bad(at, f"lists {rel[:80]!r}, which is not one of its own shards "
                       f"data/{name}/test-NNNNN-of-NNNNN.parquet")
        if rel not in files:
            raise _bad(at, f"lists {rel}, which is not in the manifest's files")
        shards.add((int(m.group(2)), int(m.group(3))))
    totals = {n for _, n in shards}
    if len(totals) != 1 or {i for i, _ in shards} != set(range(next(iter(totals)))):
        raise _bad(at, f"its shards are not one complete set 0..N-1 of the same N ({len(c.files)} listed)")
    if c.rows < len(c.files):
        raise _bad(at, f"rows ({c.rows}) is smaller than its number of shards ({len(c.files)}); shards are never empty")
    if version == "1.1" and c.rows_digest is None:
        raise _bad(at, "field 'rows_digest' is missing")
    return ConfigInfo(name, c.rows, c.kept, tuple(c.files), c.rows_digest if version == "1.1" else None)


@dataclass(frozen=True)
class Manifest:
    """The parsed ``manifest.json`` of a suite; ``sha256`` is the hash of its bytes (what results record)."""

    suite_id: str
    suite_version: str
    configs: dict[str, ConfigInfo]
    files: dict[str, ManifestFile]
    features: dict
    generator: dict
    sha256: str
    raw: dict
    format_version: int | str = FORMAT_VERSION

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str) -> Manifest:
        """Parse and check a manifest from outside; every problem is one ``IntegrityError`` naming the field."""
        raw = parse_json(data, what="manifest", where=where, max_bytes=MAX_MANIFEST_BYTES)
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            found = raw.get("format") if isinstance(raw, dict) else None
            raise IntegrityError(f"{where}: not a {FORMAT_NAME} manifest (field 'format' is "
                                 f"{found if not isinstance(found, str) else found[:64]!r})")
        version = raw.get("format_version")
        if type(version) not in (int, str) or version not in READABLE_VERSIONS:  # not True, 1.0 or "1"
            shown = version if not isinstance(version, str) else version[:20]
            raise IntegrityError(f"{where}: manifest format_version {shown!r} is not supported by this "
                                 f"genshift-bench (reads 1 and '1.1'); upgrade genshift-bench or use a "
                                 "suite revision written in a supported format")
        m = validate(_ManifestSchema, raw, where=where, fix=MANIFEST_FIX)
        check_name(m.suite_id, "suite_id", where=where, error=IntegrityError)
        for rel in m.files:
            if not SHARD_PATH_RE.fullmatch(rel):
                raise _bad(where, f"file {one_line(rel, 80)!r} is not a shard path "
                           "data/<config>/test-NNNNN-of-NNNNN.parquet (no '..', no absolute paths)")
        configs = {name: _config_info(name, c, version, m.files, where) for name, c in m.configs.items()}
        if orphans := sorted(set(m.files) - {p for c in configs.values() for p in c.files}):
            raise _bad(where, f"file {orphans[0]} belongs to no config")
        check_features(m.features, where=f"{where}: features")
        columns = list(m.features) if m.columns is None else m.columns
        if sorted(c for c in columns if isinstance(c, str)) != sorted(m.features) or len(columns) != len(m.features):
            raise _bad(where, "'columns' must list the names in 'features', each once")
        return cls(suite_id=m.suite_id, suite_version=m.suite_version, configs=configs, files=m.files,
                   features=m.features, generator=m.generator, sha256=sha256_bytes(data), raw=raw,
                   format_version=version)

    @classmethod
    def load(cls, root: str | Path) -> Manifest:
        path = Path(root) / MANIFEST
        if not path.is_file():
            hint = ("the build did not finish; rerun the same build command to resume"
                    if (Path(root) / BUILD_STATE).exists() else
                    "it is not a genshift-bench suite folder (see docs/format.md)")
            raise IntegrityError(f"{str(root)!r} has no {MANIFEST}: {hint}")
        return cls.from_bytes(read_limited(path, max_bytes=MAX_MANIFEST_BYTES, what="manifest"), where=str(path))

    def config(self, name: str) -> ConfigInfo:
        try:
            return self.configs[name]
        except KeyError:
            raise unknown("config", name, self.configs, hint=f"Configs of {self.suite_id}: "
                          f"{', '.join(sorted(self.configs))}.") from None


def verify_files(root: str | Path, manifest: Manifest, configs: list[str] | None = None, *,
                 redownload_hint: str | None = None) -> int:
    """Check size and sha256 of every file of ``configs`` (default all); returns the bytes checked."""
    root = Path(root)
    hint = redownload_hint or "rebuild the suite or restore the file"
    checked = 0
    for name in list(manifest.configs) if configs is None else configs:
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


# Arrow types of the required non-image columns, as the datasets features store them.
ROW_COLUMNS = {"image_id": (pa.string(), pa.large_string()), "label": (pa.int64(),), "keep": (pa.bool_(),),
               "config": (pa.string(), pa.large_string()), "pair_id": (pa.string(), pa.large_string())}


IMAGE_TYPES = tuple(pa.struct([("bytes", b), ("path", s)]) for b in (pa.binary(), pa.large_binary())
                    for s in (pa.string(), pa.large_string()))
MAX_ROW_GROUP_ROWS = 1000  # the format writes 100; eval streams one row group at a time
# import's largest shard has 1000 groups of 100 rows; footers grow ~9.3 KB a group (docs/format.md 4.2)
MAX_ROW_GROUPS = 2048
MAX_FOOTER_BYTES = 32 << 20


def check_parquet_footer(path: str | Path | bytes, where: str) -> None:
    """Refuse a parquet file (a path, or its bytes) whose 8-byte tail declares a footer over ``MAX_FOOTER_BYTES``."""
    if isinstance(path, bytes):
        tail = path[-8:]
    else:
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                f.seek(max(size - 8, 0))
                tail = f.read(8)
        except OSError as e:
            raise IntegrityError(f"{where}: cannot be read ({e.strerror}); re-download or rebuild the suite") from None
    if len(tail) < 8 or tail[4:] != b"PAR1":
        raise IntegrityError(f"{where}: not a parquet file (no PAR1 footer); re-download or rebuild it")
    footer = int.from_bytes(tail[:4], "little")
    if footer > MAX_FOOTER_BYTES:
        raise IntegrityError(f"{where}: parquet footer is {footer} bytes, over the limit of {MAX_FOOTER_BYTES}; "
                             "rewrite it with genshift.suite_format.SuiteWriter (100 rows per row group)")


def read_row_table(path: Path, rel: str) -> pa.Table:
    """A shard's required non-image columns; types, features and row groups are checked from the footer first."""
    check_parquet_footer(path, rel)
    try:
        meta = pq.read_metadata(path)
        if meta.num_row_groups > MAX_ROW_GROUPS:
            raise IntegrityError(f"{rel}: {meta.num_row_groups} row groups, over the limit of {MAX_ROW_GROUPS} per "
                                 "shard; write shards with genshift.suite_format.SuiteWriter (100 rows per group)")
        schema = meta.schema.to_arrow_schema()
        check_features(_features_of(schema.metadata, rel), where=rel)
        if missing := [c for c in REQUIRED_COLUMNS if c not in schema.names]:
            raise IntegrityError(f"{rel}: missing required column(s) {', '.join(missing)}; see docs/format.md")
        for c, types in {**ROW_COLUMNS, "image": IMAGE_TYPES}.items():
            if schema.field(c).type not in types:
                raise IntegrityError(f"{rel}: column {c!r} has type {schema.field(c).type}, expected {types[0]}; "
                                     "rebuild the suite with genshift.suite_format.SuiteWriter")
        if big := [i for i in range(meta.num_row_groups) if meta.row_group(i).num_rows > MAX_ROW_GROUP_ROWS]:
            raise IntegrityError(f"{rel}: row group {big[0]} holds {meta.row_group(big[0]).num_rows} rows, more than "
                                 f"{MAX_ROW_GROUP_ROWS}; write shards with genshift.suite_format.SuiteWriter (100 "
                                 "rows per group)")
        table = pq.read_table(path, columns=list(ROW_COLUMNS))
        table.validate(full=True)  # e.g. invalid UTF-8 in strings
        return table
    except (pa.ArrowException, OSError) as e:
        raise IntegrityError(f"{rel}: parquet rows cannot be read ({str(e)[:200]}); re-download or rebuild the "
                             "suite") from None


def check_rows(config: ConfigInfo, tables: list[tuple[str, pa.Table]]) -> str:
    """Check one config's rows against the manifest (``docs/format.md`` 4.2); return the rows digest."""
    name = config.name
    for rel, t in tables:
        where = f"config {name!r}, {rel} row"
        for col in ("image_id", "label", "keep", "config"):
            if (row := pc.index(pc.is_null(t[col]), True).as_py()) >= 0:
                raise IntegrityError(f"{where} {row}: {col} is null; every row needs one (rebuild the suite)")
        if (row := pc.index(pc.not_equal(t["config"], name), True).as_py()) >= 0:
            raise IntegrityError(f"{where} {row}: column config is {t['config'][row].as_py()[:64]!r}, not {name!r}; "
                                 "a row belongs to the folder it is stored in (rebuild the suite)")
        bad = pc.or_(pc.less(t["label"], 0), pc.greater_equal(t["label"], 1000))
        if (row := pc.index(bad, True).as_py()) >= 0:
            raise IntegrityError(f"{where} {row}: label {t['label'][row].as_py()} is not an ImageNet-1k index in "
                                 "[0, 1000); fix the label (see docs/format.md)")
    rows = sum(t.num_rows for _, t in tables)
    ids, labels, keeps = _sorted_rows(pa.concat_tables(t for _, t in tables))
    if rows > 1 and pc.any(pc.equal(ids.slice(1), ids.slice(0, rows - 1))).as_py():  # sorted: repeats are adjacent
        _duplicate_error(name, tables)
    kept = int(pc.sum(keeps).as_py() or 0)
    if rows != config.rows:
        raise IntegrityError(f"config {name!r} has {rows} rows, the manifest says {config.rows}; the manifest does "
                             "not describe these shards (re-download or rebuild the suite)")
    if kept != config.kept:
        raise IntegrityError(f"config {name!r} has {kept} rows with keep=true, the manifest says {config.kept}; "
                             "the manifest does not describe these shards (re-download or rebuild the suite)")
    digest = _digest_sorted(ids, labels, keeps)
    if config.rows_digest is not None and digest != config.rows_digest:
        raise IntegrityError(f"config {name!r}: rows digest {digest[:12]}… of its (image_id, label, keep) rows differs "
                             f"from the manifest's {config.rows_digest[:12]}…; re-download or rebuild the suite")
    return digest


def _duplicate_error(name: str, tables: list[tuple[str, pa.Table]]) -> None:
    first: dict[str, tuple[str, int, tuple]] = {}
    for rel, t in tables:
        for i, row in enumerate(zip(*(t[c].to_pylist() for c in ("image_id", "label", "keep", "pair_id")))):
            if row[0] in first:
                rel0, i0, row0 = first[row[0]]
                what = "is a duplicated row" if row0 == row else "repeats its image_id"
                raise IntegrityError(f"config {name!r}, {rel} row {i} {what} (image_id {row[0][:80]!r} is also "
                                     f"{rel0} row {i0}); image ids must be unique: remove the duplicate and rebuild")
            first[row[0]] = (rel, i, row)


def _leaf_paths(path: str, t: pa.DataType) -> list[str]:
    """Parquet's leaf column paths of one column (``img.bytes``, ``emb.list.element``)."""
    if pa.types.is_struct(t):
        return [leaf for f in t for leaf in _leaf_paths(f"{path}.{f.name}", f.type)]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _leaf_paths(f"{path}.list.element", t.value_type)
    return [path]


class SuiteWriter:
    """Write a suite into ``root``, shard by shard, resumably. ``fingerprint``: everything that determines the
    content (settings, seeds, model ids); ``overwrite`` replaces a build with another one or a finished build."""

    def __init__(self, root: str | Path, *, suite_id: str, suite_version: str = "1.0.0",
                 extra_features: Features | dict | None = None, fingerprint: Mapping | None = None,
                 overwrite: bool = False, rows_per_group: int = IMAGE_ROWS_PER_GROUP,
                 clean_incomplete: bool = True) -> None:
        self.root = Path(root)
        self.suite_id = check_name(suite_id, "suite id")
        self.suite_version = suite_version
        self.features = base_features()  # then the provenance columns
        for column, feature in (extra_features or {}).items():
            if column in self.features:
                raise ValueError(f"provenance column {column!r} clashes with a required column")
            self.features[column] = feature
        self.rows_per_group = rows_per_group
        state = {"suite_id": suite_id, "suite_version": suite_version, "features": self.features.to_dict(),
                 "fingerprint": dict(fingerprint or {})}
        self.fingerprint_sha256 = fsutil.sha256_bytes(fsutil.canonical_json(state))
        state_path = self.root / BUILD_STATE
        if self.root.exists() and any(self.root.iterdir()):
            if state_path.is_file():
                try:
                    old = fsutil.read_json(state_path, max_bytes=MAX_STATE_BYTES, what=BUILD_STATE)
                except IntegrityError:
                    old = {}
                old = old if isinstance(old, dict) else {}
                if old.get("fingerprint_sha256") != self.fingerprint_sha256 and not overwrite:
                    raise BenchError(f"output directory {str(self.root)!r} holds a different build "
                                     f"(suite {old.get('suite_id')!r}, other settings); pass --overwrite to "
                                     "replace it or choose another --out")
            elif not ((self.root / MANIFEST).is_file() and overwrite):
                raise BenchError(f"output directory {str(self.root)!r} is not empty and holds no bench build; "
                                 "choose an empty or new directory")
            if overwrite:
                shutil.rmtree(self.root)
        fsutil.ensure_writable_dir(self.root)
        if not state_path.is_file():
            fsutil.atomic_write_json(state_path, {**state, "fingerprint_sha256": self.fingerprint_sha256})
        if clean_incomplete:  # one process cleans: in a distributed build, others' in-flight files look the same
            for stale in self.root.rglob(f"*{fsutil.INCOMPLETE}"):
                log.warning("removing %s left by an interrupted run", stale)
                stale.unlink()

    def __enter__(self) -> SuiteWriter:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def shard_done(self, config: str, index: int, num_shards: int) -> bool:
        """True iff the shard's final file exists and its parquet footer reads."""
        p = self.root / shard_name(config, index, num_shards)
        if not p.is_file():
            return False
        try:
            pq.read_metadata(p)
        except Exception:  # a corrupt final file cannot come from us (atomic rename), but be safe
            log.warning("shard %s is unreadable; it will be rewritten", p)
            p.unlink()
            return False
        return True

    def write_shard(self, config: str, index: int, num_shards: int, rows: Iterable[Mapping]) -> None:
        """Write one shard atomically from an iterable of row dicts (streamed, bounded memory)."""
        rel = shard_name(config, index, num_shards)  # checks the config name
        for other in (self.root / "data" / config).glob("*.parquet"):
            m = SHARD_RE.match(other.name)
            if m and int(m.group(2)) != num_shards:
                raise BenchError(f"{other} was written with {int(m.group(2))} shards, this run asks for "
                                 f"{num_shards}; keep the shard count of a build, or pass --overwrite")
        n = 0
        schema, group = self.features.arrow_schema, self.rows_per_group  # the schema carries the features metadata
        with fsutil.atomic_path(self.root / rel) as tmp:
            with pq.ParquetWriter(tmp, schema, **self._parquet_options()) as writer:
                batch: list[dict] = []
                for row in rows:
                    self._check_row(row, config, rel)
                    batch.append(self.features.encode_example(dict(row)))
                    n += 1
                    if len(batch) == group:
                        writer.write_table(pa.Table.from_pylist(batch, schema=schema), row_group_size=group)
                        batch = []
                if batch:
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema), row_group_size=group)
                if n == 0:
                    raise BenchError(f"shard {rel} would be empty; a config needs at least one row per shard "
                                     "(use fewer shards)")
        log.debug("wrote %s: %d rows", rel, n)

    def _parquet_options(self) -> dict:
        """``datasets``' column options (``docs/format.md`` section 3); content-defined chunking dedups Hub uploads."""
        from datasets import Image

        schema = self.features.arrow_schema
        compression, dictionary, encoding = {}, [], {}
        for name, feat in self.features.items():
            for leaf in _leaf_paths(name, schema.field(name).type):
                if isinstance(feat, Image):
                    compression[leaf], encoding[leaf] = "none", "PLAIN"
                else:
                    compression[leaf] = "snappy"
                    dictionary.append(leaf)
        return {"compression": compression, "use_dictionary": dictionary, "column_encoding": encoding,
                "write_page_index": True, "use_content_defined_chunking": True}

    def _check_row(self, row: Mapping, config: str, rel: str) -> None:
        if missing := [c for c in self.features if c not in row]:
            raise ValueError(f"row for {rel} lacks column(s) {missing}")
        if extra := [c for c in row if c not in self.features]:
            raise ValueError(f"row for {rel} has undeclared column(s) {extra}; declare them in extra_features")
        if row["config"] != config:
            raise ValueError(f"row {row['image_id']!r} has config {row['config']!r} but is written to {config!r}")
        label = row["label"]
        if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < 1000:
            raise ValueError(f"row {row['image_id']!r}: label must be an ImageNet-1k index 0..999, got {label!r}")
        if not isinstance(row["image_id"], str) or not row["image_id"]:
            raise ValueError(f"row in {rel}: image_id must be a non-empty string, got {row['image_id']!r}")
        image = row["image"]
        if not isinstance(image, Mapping) or not isinstance(image.get("bytes"), bytes) or image.get("path") is not None:
            raise ValueError(f"row {row['image_id']!r}: image must be embedded as {{'bytes': <encoded image>, "
                             "'path': None}")

    def finalize(self, *, generator: Mapping, card: Callable[[Manifest], str] | None = None) -> Manifest:
        """Check completeness and uniqueness, hash the shards, write the card and, last, the manifest."""
        configs: dict[str, dict] = {}
        files: dict[str, dict] = {}
        data = self.root / "data"
        if not data.is_dir():
            raise BenchError(f"{self.root} has no shards; nothing was written")
        seen: dict[str, str] = {}
        for cdir in sorted(p for p in data.iterdir() if p.is_dir()):
            paths = sorted(p for p in cdir.iterdir() if SHARD_RE.match(p.name))
            numbers = [tuple(map(int, SHARD_RE.match(p.name).groups())) for p in paths]  # (index, count)
            counts = {n for _, n in numbers}
            if len(counts) != 1:
                raise IntegrityError(f"{cdir}: shards of different shard counts {sorted(counts)}; rebuild with "
                                     "--overwrite")
            total = counts.pop()
            if missing := sorted(set(range(total)) - {i for i, _ in numbers}):
                raise BenchError(f"config {cdir.name!r} is missing shard(s) {missing[:10]} of {total}; "
                                 "rerun the build to finish them")
            rels = [p.relative_to(self.root).as_posix() for p in paths]
            tables = [pq.read_table(p, columns=["image_id", "label", "keep"]) for p in paths]
            for rel, table in zip(rels, tables):
                for iid in table["image_id"].to_pylist():
                    if iid in seen:
                        raise IntegrityError(f"duplicate image_id {iid!r} in {rel} and {seen[iid]}; image ids must "
                                             "be unique across the suite")
                    seen[iid] = rel
            files.update({rel: {"size": p.stat().st_size, "sha256": sha256_file(p)} for rel, p in zip(rels, paths)})
            table = pa.concat_tables(tables)
            configs[cdir.name] = {"rows": table.num_rows, "kept": int(pc.sum(table["keep"]).as_py() or 0),
                                  "files": rels, "rows_digest": rows_digest_table(table)}
        manifest_bytes = canonical_json({
            "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "suite_id": self.suite_id,
            "suite_version": self.suite_version, "split": SPLIT, "files": files, "features": self.features.to_dict(),
            "generator": dict(generator), "configs": configs,
            "columns": list(self.features),  # column order (JSON object keys are sorted)
        })
        manifest = Manifest.from_bytes(manifest_bytes, where=str(self.root / MANIFEST))
        if card is not None:
            fsutil.atomic_write_bytes(self.root / CARD, card(manifest).encode())
        fsutil.atomic_write_bytes(self.root / MANIFEST, manifest_bytes)
        return manifest


MAX_CARD_BYTES = 1 << 20
MAX_YAML_DEPTH = 32


@dataclass(frozen=True)
class RowGroup:
    """One streaming unit: a parquet row group of one shard."""

    config: str
    path: str  # relative to the suite root
    index: int
    num_rows: int


@dataclass
class LocalSuite:
    """A suite folder with a parsed manifest; for a Hub snapshot, its ``repo_id`` and resolved ``revision`` sha."""

    root: Path
    manifest: Manifest
    repo_id: str | None = None
    revision: str | None = None
    redownload_hint: str | None = None
    pinned: bool = True  # False when taken from an unpinned registry entry (resolved at download)
    card: dict | None = None  # the card's YAML header, checked against the manifest (None: no card)
    _verified: set[str] = field(default_factory=set)
    _digests: dict[str, str] = field(default_factory=dict)

    @classmethod
    def open(cls, root: str | Path, *, repo_id: str | None = None, revision: str | None = None,
             redownload_hint: str | None = None) -> LocalSuite:
        root = Path(root)
        if not root.exists():
            raise BenchError(f"suite folder {str(root)!r} does not exist; give a registry id (see `bench suites`) "
                             "or the path of a suite folder")
        if not root.is_dir():
            raise BenchError(f"suite path {str(root)!r} is not a folder")
        # huggingface_hub's cache links snapshots/<sha>/<file> to ../../blobs/<hash>: for a Hub snapshot
        # the links may lead anywhere inside that repo's cache folder, and nowhere else.
        base = root.resolve()
        inside = base.parent.parent if repo_id and base.parent.name == "snapshots" else base
        _check_inside(root, MANIFEST, inside)
        manifest = Manifest.load(root)
        for rel in (CARD, *manifest.files):
            _check_inside(root, rel, inside)
        card = parse_card(root / CARD, manifest) if (root / CARD).is_file() else None
        return cls(root=root, manifest=manifest, repo_id=repo_id, revision=revision, redownload_hint=redownload_hint,
                   card=card)

    @property
    def suite_id(self) -> str:
        return self.manifest.suite_id

    @property
    def configs(self) -> list[str]:
        return sorted(self.manifest.configs)

    def select(self, configs: list[str] | None) -> list[str]:
        """Validate a config selection (None = all), keeping the manifest's order."""
        if configs is None:
            return self.configs
        for c in configs:
            self.manifest.config(c)  # raises with "did you mean"
        return list(dict.fromkeys(configs))

    def verify(self, configs: list[str] | None = None) -> None:
        """Check the selected configs' files (size, sha256, features) and rows, never reading image bytes."""
        todo = [c for c in self.select(configs) if c not in self._verified]
        verify_files(self.root, self.manifest, todo, redownload_hint=self.redownload_hint)
        for c in todo:
            info = self.manifest.config(c)
            tables = [(rel, read_row_table(self.root / rel, rel)) for rel in info.files]
            self._digests[c] = check_rows(info, tables)
        self._verified.update(todo)

    def rows_digest(self, config: str) -> str:
        """The config's rows digest: the manifest's, or for a format-1 suite computed from its verified rows."""
        recorded = self.manifest.config(config).rows_digest
        if recorded is not None:
            return recorded
        self.verify([config])
        return self._digests[config]

    def require_card(self) -> dict:
        """The card's YAML header; a suite without ``README.md`` is refused (it is part of the format)."""
        if self.card is None:
            raise IntegrityError(f"{self.root} has no {CARD} (dataset card), which the format requires so that "
                                 "datasets.load_dataset(folder, config) works; rebuild the suite or render one "
                                 "with genshift.data_cards.render_card")
        return self.card

    def _require_verified(self, config: str) -> None:
        if config not in self._verified:
            raise IntegrityError(f"config {config!r} of {self.suite_id} was not verified against its manifest; "
                                 "call LocalSuite.verify first")

    def files(self, config: str) -> list[Path]:
        return [self.root / rel for rel in self.manifest.config(config).files]

    def dataset(self, config: str, *, cache_dir: str | None = None):
        """``datasets.Dataset`` of one config (verified first), via the parquet builder."""
        from datasets import load_dataset

        self.verify([config])
        return load_dataset("parquet", data_files={"test": [str(p) for p in self.files(config)]},
                            split="test", cache_dir=cache_dir)

    def row_groups(self, config: str) -> list[RowGroup]:
        self._require_verified(config)
        out = []
        for rel in self.manifest.config(config).files:
            md = pq.read_metadata(self.root / rel)
            out.extend(RowGroup(config, rel, i, md.row_group(i).num_rows) for i in range(md.num_row_groups))
        return out

    def read_columns(self, config: str, columns: list[str]) -> pa.Table:
        """Non-image columns of a whole config (small: no image bytes)."""
        self._require_verified(config)
        return pa.concat_tables(pq.read_table(p, columns=columns) for p in self.files(config))


def read_row_group(root: str | Path, group: RowGroup, columns: list[str] | None = None) -> pa.Table:
    """One row group, from a small cache of open shards (a footer parsed once, not once per group)."""
    path = Path(root) / group.path
    return _open_shard(str(path), StatKey.of(path), os.getpid(), threading.get_ident()).read_row_group(
        group.index, columns=columns)


@functools.lru_cache(maxsize=16)
def _open_shard(path: str, identity: StatKey, pid: int, thread: int) -> pq.ParquetFile:
    # keyed by the file's identity (a shard replaced at the same path is opened anew), by pid (a forked
    # DataLoader worker opens its own) and by thread (one ParquetFile read from two threads at once fails)
    return pq.ParquetFile(path)


def _check_inside(root: Path, rel: str, inside: Path) -> None:
    try:
        target = (root / rel).resolve()
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
        raise IntegrityError(f"{rel} in {root} is a symlink loop; replace the link with the file") from None
    if not target.is_relative_to(inside):
        raise IntegrityError(f"{rel} in {root} resolves to {target}, outside the suite folder (a symlink leaving "
                             "it); a suite's files must live inside its folder: replace the link with the file")


def parse_card(path: Path, manifest: Manifest) -> dict:
    """The card's YAML header, parsed with size, depth and alias limits; it must list one ``configs`` entry
    per manifest config with its own shards as the ``test`` split (``datasets.load_dataset(folder, config)``)."""
    where = str(path)
    data = read_limited(path, max_bytes=MAX_CARD_BYTES, what="dataset card")
    fix = "re-render the card with genshift.data_cards.render_card (docs/format.md section 5)"

    def bad(what: str) -> IntegrityError:
        return IntegrityError(f"{where}: {what}; {fix}")

    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        raise bad("the card is not UTF-8") from None
    end = next((i for i, ln in enumerate(lines[1:], 1) if ln.strip() == "---"), None)
    if lines[0].strip() != "---" or end is None:
        raise bad("the card has no YAML header between '---' lines")
    head = load_yaml("\n".join(lines[1:end]), what="the card's YAML", where=where, max_depth=MAX_YAML_DEPTH,
                     fix=f"; {fix}")
    if not isinstance(head, dict):
        raise bad("the card's YAML header is not a mapping")
    entries = head.get("configs")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise bad("the card's header has no 'configs' list")
    named = {}
    for e in entries:
        name = e.get("config_name")
        if not isinstance(name, str) or name in named:
            raise bad(f"the card's configs have a missing or repeated config_name {str(name)[:64]!r}")
        named[name] = e.get("data_files")
    if set(named) != set(manifest.configs):
        diff = sorted(set(named) ^ set(manifest.configs))
        raise bad(f"the card's configs differ from the manifest's (e.g. {diff[0][:64]!r})")
    for name, files in named.items():
        want = [{"split": SPLIT, "path": f"data/{name}/*.parquet"}]
        if files != want and files != want[0]:
            raise bad(f"config {name!r} in the card must have data_files {want} (its own shards as the test split)")
    return head
