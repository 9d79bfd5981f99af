"""The suite writer of every builder and of ``bench import-folder`` (``docs/format.md`` section 3): one atomic
``write_shard`` per shard (a rerun with the same ``fingerprint`` skips those ``shard_done`` says are finished; another
fingerprint is refused unless ``overwrite``), then ``finalize`` writes the card and, last, the manifest."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datasets import Features, Image

from genshift import fsutil, suite_format
from genshift.errors import BenchError, IntegrityError
from genshift.suite_format import BUILD_STATE, CARD, MANIFEST, SHARD_RE, Manifest

log = logging.getLogger(__name__)
IMAGE_ROWS_PER_GROUP = 100  # parquet row group = one streaming unit for eval
MAX_STATE_BYTES = 16 << 20  # build.json: the settings and features of a build


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
        self.suite_id = suite_format.check_name(suite_id, "suite id")
        self.suite_version = suite_version
        self.features = suite_format.base_features()  # then the provenance columns
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
        p = self.root / suite_format.shard_name(config, index, num_shards)
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
        rel = suite_format.shard_name(config, index, num_shards)  # checks the config name
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
        """Check completeness and uniqueness, write the card and, last, the manifest."""
        configs: dict[str, dict] = {}
        data = self.root / "data"
        if not data.is_dir():
            raise BenchError(f"{self.root} has no shards; nothing was written")
        seen: dict[str, str] = {}
        for cdir in sorted(p for p in data.iterdir() if p.is_dir()):
            files = sorted(p for p in cdir.iterdir() if SHARD_RE.match(p.name))
            numbers = [tuple(map(int, SHARD_RE.match(p.name).groups())) for p in files]  # (index, count)
            counts = {n for _, n in numbers}
            if len(counts) != 1:
                raise IntegrityError(f"{cdir}: shards of different shard counts {sorted(counts)}; rebuild with "
                                     "--overwrite")
            total = counts.pop()
            if missing := sorted(set(range(total)) - {i for i, _ in numbers}):
                raise BenchError(f"config {cdir.name!r} is missing shard(s) {missing[:10]} of {total}; "
                                 "rerun the build to finish them")
            tables = [pq.read_table(p, columns=["image_id", "label", "keep"]) for p in files]
            for p, table in zip(files, tables):
                for iid in table["image_id"].to_pylist():
                    if iid in seen:
                        raise IntegrityError(f"duplicate image_id {iid!r} in {p.relative_to(self.root)} and "
                                             f"{seen[iid]}; image ids must be unique across the suite")
                    seen[iid] = str(p.relative_to(self.root))
            table = pa.concat_tables(tables)
            configs[cdir.name] = {"rows": table.num_rows, "kept": int(pc.sum(table["keep"]).as_py() or 0),
                                  "files": [p.relative_to(self.root).as_posix() for p in files],
                                  "rows_digest": suite_format.rows_digest_table(table)}
        manifest_bytes = suite_format.build_manifest(self.root, suite_id=self.suite_id, configs=configs,
                                                     suite_version=self.suite_version, features=self.features,
                                                     generator=dict(generator))
        manifest = Manifest.from_bytes(manifest_bytes, where=str(self.root / MANIFEST))
        if card is not None:
            fsutil.atomic_write_bytes(self.root / CARD, card(manifest).encode())
        fsutil.atomic_write_bytes(self.root / MANIFEST, manifest_bytes)
        return manifest
