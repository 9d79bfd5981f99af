"""Read a suite in format 1 or 1.1 from a local folder: the one validation layer for suites from outside
(``docs/format.md`` section 4.2), every file checked before any model is loaded; rows stream by row group."""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from genshift import suite_format
from genshift.errors import BenchError, IntegrityError
from genshift.fsutil import StatKey, load_yaml, read_limited
from genshift.suite_format import CARD, MANIFEST, SPLIT, Manifest

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
        suite_format.verify_files(self.root, self.manifest, todo, redownload_hint=self.redownload_hint)
        for c in todo:
            info = self.manifest.config(c)
            tables = [(rel, suite_format.read_row_table(self.root / rel, rel)) for rel in info.files]
            self._digests[c] = suite_format.check_rows(info, tables)
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
