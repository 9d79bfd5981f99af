"""Read a suite in format 1 from a local folder (a build output or a Hub snapshot).

Nothing is scored before :meth:`LocalSuite.verify` has checked the selected configs' files
against the manifest. Rows can be read two ways:

- :meth:`LocalSuite.dataset` gives a ``datasets.Dataset`` through the offline-safe pattern
  (``load_dataset("parquet", data_files=...)``) for users and tests;
- :meth:`LocalSuite.row_groups` + :func:`read_row_group` stream parquet row groups with
  pyarrow, in bounded memory, for the eval harness.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchmark.errors import BenchError, IntegrityError
from benchmark.suite_format import CARD, Manifest, check_features, read_parquet_features, verify_files


@dataclass(frozen=True)
class RowGroup:
    """One streaming unit: a parquet row group of one shard."""

    config: str
    path: str  # relative to the suite root
    index: int
    num_rows: int


@dataclass
class LocalSuite:
    """A suite folder with a parsed manifest.

    ``repo_id`` and ``revision`` are set when the folder is a Hub snapshot; ``revision`` is then
    the resolved 40-character commit sha.
    """

    root: Path
    manifest: Manifest
    repo_id: str | None = None
    revision: str | None = None
    redownload_hint: str | None = None
    pinned: bool = True  # False when taken from an unpinned registry entry (resolved at download)
    _verified: set[str] = field(default_factory=set)

    @classmethod
    def open(cls, root: str | Path, *, repo_id: str | None = None, revision: str | None = None,
             redownload_hint: str | None = None) -> "LocalSuite":
        root = Path(root)
        if not root.exists():
            raise BenchError(f"suite folder {str(root)!r} does not exist; give a registry id (see `bench suites`) "
                             "or the path of a suite folder")
        if not root.is_dir():
            raise BenchError(f"suite path {str(root)!r} is not a folder")
        return cls(root=root, manifest=Manifest.load(root), repo_id=repo_id, revision=revision,
                   redownload_hint=redownload_hint)

    @property
    def suite_id(self) -> str:
        return self.manifest.suite_id

    @property
    def configs(self) -> list[str]:
        return sorted(self.manifest.configs)

    @property
    def card_path(self) -> Path | None:
        p = self.root / CARD
        return p if p.is_file() else None

    def select(self, configs: list[str] | None) -> list[str]:
        """Validate a config selection (None = all), keeping the manifest's order."""
        if configs is None:
            return self.configs
        for c in configs:
            self.manifest.config(c)  # raises with "did you mean"
        return list(dict.fromkeys(configs))

    def verify(self, configs: list[str] | None = None) -> None:
        """Check sizes, hashes and embedded features of the selected configs' files."""
        todo = [c for c in self.select(configs) if c not in self._verified]
        if not todo:
            return
        verify_files(self.root, self.manifest, todo, redownload_hint=self.redownload_hint)
        for c in todo:
            for rel in self.manifest.config(c).files:
                check_features(read_parquet_features(self.root / rel), where=rel)
        self._verified.update(todo)

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
    """Read one row group (used inside DataLoader workers; opens the file itself)."""
    return pq.ParquetFile(Path(root) / group.path).read_row_group(group.index, columns=columns)
