"""Per-image predictions files: the schema, and checkpointed writing with resume.

One parquet file per (model, suite config), rows sorted by ``image_id``:

=================  ==========================  ==============================================
column             type                        meaning
=================  ==========================  ==============================================
image_id           string                      the suite's image id
label              int16                       true ImageNet-1k class
keep               bool                        the suite's quality-filter flag
pair_id            string (nullable)           the suite's pair id (LANCE joins)
topk_idx           fixed_size_list<int16>[K]   the K most probable classes, most probable first
topk_prob          fixed_size_list<float32>[K] their softmax probabilities
true_prob          float32                     softmax probability of the true class
true_rank          int32                       number of classes more probable than the true one
=================  ==========================  ==============================================

plus string columns copied from the suite when present (``CARRIED_COLUMNS``). ``true_rank``
makes acc@k exact for every k (``true_rank < k``), not only k <= K. Metrics are pure functions
of these files (``eval.scoring``), so every number can be recomputed without a GPU.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmark.errors import IntegrityError
from benchmark.fsutil import atomic_path

log = logging.getLogger(__name__)
TOPK = 10
CARRIED_COLUMNS = ("edit_type", "edit_type_fine", "source_image_id")
BASE_COLUMNS = ("image_id", "label", "keep", "pair_id", "topk_idx", "topk_prob", "true_prob", "true_rank")


def schema(topk: int = TOPK, carried: tuple[str, ...] = ()) -> pa.Schema:
    fields = [
        pa.field("image_id", pa.string(), nullable=False),
        pa.field("label", pa.int16(), nullable=False),
        pa.field("keep", pa.bool_(), nullable=False),
        pa.field("pair_id", pa.string()),
        pa.field("topk_idx", pa.list_(pa.int16(), topk), nullable=False),
        pa.field("topk_prob", pa.list_(pa.float32(), topk), nullable=False),
        pa.field("true_prob", pa.float32(), nullable=False),
        pa.field("true_rank", pa.int32(), nullable=False),
    ]
    fields += [pa.field(c, pa.string()) for c in carried]
    return pa.schema(fields)


@dataclass
class PredictionBlock:
    """Predictions for a run of rows (what one checkpoint holds)."""

    image_id: list[str]
    label: np.ndarray
    keep: np.ndarray
    pair_id: list[str | None]
    topk_idx: np.ndarray   # (n, K) int
    topk_prob: np.ndarray  # (n, K) float32
    true_prob: np.ndarray
    true_rank: np.ndarray
    carried: dict[str, list]

    def to_table(self, sch: pa.Schema) -> pa.Table:
        k = self.topk_idx.shape[1]
        cols = {
            "image_id": pa.array(self.image_id, pa.string()),
            "label": pa.array(self.label.astype(np.int16)),
            "keep": pa.array(self.keep.astype(bool)),
            "pair_id": pa.array(self.pair_id, pa.string()),
            "topk_idx": pa.FixedSizeListArray.from_arrays(pa.array(self.topk_idx.astype(np.int16).ravel()), k),
            "topk_prob": pa.FixedSizeListArray.from_arrays(pa.array(self.topk_prob.astype(np.float32).ravel()), k),
            "true_prob": pa.array(self.true_prob.astype(np.float32)),
            "true_rank": pa.array(self.true_rank.astype(np.int32)),
        }
        for name in sch.names:
            if name not in cols:
                cols[name] = pa.array(self.carried[name], pa.string())
        return pa.table(cols, schema=sch)


class CheckpointedPredictions:
    """Collect prediction blocks for one config, flushing parts atomically so a killed run resumes.

    Parts live in ``<work_dir>/<config>/part-<first unit>-<last unit>.parquet``; ``done_units``
    tells the runner which streaming units to skip. ``finish`` merges the parts, sorted by
    ``image_id``, into the final file and removes them.
    """

    def __init__(self, work_dir: Path, config: str, sch: pa.Schema, *, flush_rows: int = 2048) -> None:
        self.dir = Path(work_dir) / config
        self.dir.mkdir(parents=True, exist_ok=True)
        self.schema = sch
        self.flush_rows = flush_rows
        self._pending: list[pa.Table] = []
        self._pending_units: list[int] = []
        self.done_units: set[int] = set()
        for part in sorted(self.dir.glob("part-*.parquet")):
            try:
                first, last = (int(x) for x in part.stem.split("-")[1:3])
                if pq.read_schema(part) != sch:
                    raise ValueError("schema differs")
            except Exception:  # noqa: BLE001 - a part from another version of the run: redo it
                log.warning("ignoring unreadable checkpoint %s", part)
                part.unlink()
                continue
            self.done_units.update(range(first, last + 1))

    def add(self, unit: int, block: PredictionBlock) -> None:
        self._pending.append(block.to_table(self.schema))
        self._pending_units.append(unit)
        if sum(t.num_rows for t in self._pending) >= self.flush_rows:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        units = self._pending_units
        if units != list(range(units[0], units[-1] + 1)):
            raise RuntimeError(f"units flushed out of order: {units}")
        with atomic_path(self.dir / f"part-{units[0]:07d}-{units[-1]:07d}.parquet") as tmp:
            pq.write_table(pa.concat_tables(self._pending), tmp)
        self.done_units.update(units)
        self._pending, self._pending_units = [], []

    def finish(self, out_path: Path) -> int:
        """Merge all parts into ``out_path`` (sorted by image_id); returns the row count."""
        self.flush()
        parts = sorted(self.dir.glob("part-*.parquet"))
        table = pa.concat_tables([pq.read_table(p) for p in parts]) if parts else self.schema.empty_table()
        table = table.take(pc.sort_indices(table, [("image_id", "ascending")]))
        with atomic_path(out_path) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        shutil.rmtree(self.dir)
        return table.num_rows


def read_predictions(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """Read one predictions file, checking it has the base columns."""
    try:
        table = pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowInvalid) as e:
        raise IntegrityError(f"predictions file {path} is not readable parquet ({e})") from None
    need = [c for c in (columns or BASE_COLUMNS) if c in BASE_COLUMNS]
    missing = [c for c in need if c not in table.column_names]
    if missing:
        raise IntegrityError(f"predictions file {path} lacks column(s) {missing}")
    return table


def topk_matrix(table: pa.Table) -> np.ndarray:
    """``topk_idx`` as an (n, K) int array."""
    col = table["topk_idx"].combine_chunks()
    k = col.type.list_size
    return col.flatten().to_numpy(zero_copy_only=False).reshape(-1, k)
