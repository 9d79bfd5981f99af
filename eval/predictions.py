"""Per-image predictions files (one per model and suite config; ``docs/results.md``, "Predictions file"): the
schema, bounded reading, and checkpointed writing with resume.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from genshift.errors import IntegrityError
from genshift.fsutil import atomic_path, atomic_write_bytes, canonical_json, sha256_bytes
from genshift.suite_format import check_parquet_footer

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
        cols |= {name: pa.array(self.carried[name], pa.string()) for name in sch.names if name not in cols}
        return pa.table(cols, schema=sch)


# Names that become path components under an output folder (suite configs): one strict pattern.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PART_NAME = re.compile(r"^part-(\d{7})-(\d{7})\.parquet$")


def part_range(part: Path, n_units: int | None = None) -> tuple[int, int]:
    """``(first, last)`` unit of a part file from its name, checked against the run's unit count
    before anything is built from it (a name cannot make a huge range)."""
    m = PART_NAME.match(part.name)
    if not m:
        raise IntegrityError(f"checkpoint {str(part)!r}: not a part name (part-NNNNNNN-NNNNNNN.parquet); it was not "
                             "written by bench eval, remove it or rerun with --force")
    first, last = int(m.group(1)), int(m.group(2))
    if first > last or (n_units is not None and last >= n_units):
        raise IntegrityError(f"checkpoint {str(part)!r}: units {first}..{last} are not inside this run's "
                             f"0..{(n_units or 0) - 1}; it was not written by this run, remove it or rerun with "
                             "--force")
    return first, last


def done_units(config_dir: Path, n_units: int | None = None) -> set[int]:
    """Units with a part in ``config_dir``, from the part names (bounded by the unit count); what the
    parts hold is checked when they are merged (``genshift.eval.merging``)."""
    done: set[int] = set()
    for part in sorted(config_dir.glob("part-*.parquet")) if config_dir.is_dir() else ():
        first, last = part_range(part, n_units)
        done.update(range(first, last + 1))
    return done


def unit_digest(image_ids) -> str:
    """What a unit holds, independent of order: sha256 over its sorted image ids (16 hex)."""
    return sha256_bytes("\n".join(sorted(image_ids)).encode("utf-8"))[:16]


def first_per_class(ids: list[str], labels: list[int], limit: int) -> set[str]:
    """``limit_per_class``'s selection: the first ``limit`` image ids of each class in image_id order."""
    chosen, per_class = set(), Counter()
    for i, c in sorted(zip(ids, labels)):  # image ids are unique
        if per_class[c] < limit:
            per_class[c] += 1
            chosen.add(i)
    return chosen


def contained(path: Path, root: Path) -> Path:
    """``path`` resolved, asserted to lie strictly inside ``root`` (nothing outside ``--out`` is
    ever written or removed, whatever names a suite's manifest carries)."""
    full, base = Path(path).resolve(), Path(root).resolve()
    if full == base or base not in full.parents:
        raise IntegrityError(f"refusing to touch {str(path)!r}: it is not inside {str(root)!r}")
    return full


def check_config_name(config: str) -> str:
    if not isinstance(config, str) or not SAFE_NAME.match(config) or ".." in config:
        raise IntegrityError(f"config name {config!r} cannot be used as a file or folder name (letters, digits, "
                             "'.', '_', '-' only); fix the suite's manifest")
    return config


def safe_config_dir(work_dir: Path, config: str) -> Path:
    return contained(Path(work_dir) / check_config_name(config), work_dir)


class CheckpointedPredictions:
    """Collect prediction blocks for one config, flushing parts (``genshift.eval.merging``) atomically every
    ``flush_rows`` rows and every ``flush_seconds`` so a killed run resumes (``done_units``: what to skip);
    ``finish`` merges every process's parts, sorted by ``image_id``, into the final file."""

    def __init__(self, work_dir: Path, config: str, sch: pa.Schema, *, flush_rows: int = 2048,
                 flush_seconds: float = 30.0, session: str = "", rank: int = 0, run_key: str = "",
                 n_units: int | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.dir = safe_config_dir(self.work_dir, config)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.schema, self.flush_rows, self.flush_seconds = sch, flush_rows, flush_seconds
        self.session, self.rank, self.run_key, self.n_units = session, rank, run_key, n_units
        self._pending: list[tuple[int, pa.Table, list[str]]] = []  # (unit, its rows, its skipped image ids)
        self._timings = {"model_seconds": 0.0}
        self._last_flush = time.monotonic()
        self.batch_size: int | None = None
        self.done_units = done_units(self.dir, n_units)  # from any process or an earlier run

    def add(self, unit: int, block: PredictionBlock, *, skipped_bad: list[str] = (), model_seconds: float = 0.0,
            threads_used: int = 1) -> None:
        self._pending.append((unit, block.to_table(self.schema), list(skipped_bad)))
        self._timings["model_seconds"] += model_seconds
        # how many threads had run this model's batches so far: the evidence that --forward-threads ran
        self._timings["forward_threads_used"] = max(self._timings.get("forward_threads_used", 0), threads_used)
        if (sum(t.num_rows for _, t, _ in self._pending) >= self.flush_rows
                or time.monotonic() - self._last_flush >= self.flush_seconds):
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        units = [u for u, _, _ in self._pending]
        if units != sorted(units) or len(set(units)) != len(units):
            raise RuntimeError(f"units flushed out of order: {units}")
        now = time.monotonic()
        timings = {**self._timings, "seconds": round(now - self._last_flush, 3)}
        # one part per contiguous run of units (a process of a distributed sweep holds scattered units);
        # the flush's timings go in the first part's sidecar; rows and skipped images are per unit, so a
        # merge can check every part against the units it names (genshift.eval.merging)
        starts = [i for i, u in enumerate(units) if i == 0 or u != units[i - 1] + 1]
        for first, end in zip(starts, [*starts[1:], len(units)]):
            run = self._pending[first:end]
            name = f"part-{run[0][0]:07d}-{run[-1][0]:07d}"
            skipped = [s for _, _, s in run]
            info = {**timings, "units": [u for u, _, _ in run], "batch_size": self.batch_size, "session": self.session,
                    "rank": self.rank, "run_key": self.run_key, "rows_per_unit": [t.num_rows for _, t, _ in run],
                    "skipped_per_unit": skipped, "skipped_bad": [x for s in skipped for x in s]}
            atomic_write_bytes(self.dir / f"{name}.json", canonical_json(info))
            with atomic_path(self.dir / f"{name}.parquet") as tmp:
                pq.write_table(pa.concat_tables([t for _, t, _ in run]), tmp)
            timings = {"model_seconds": 0.0, "seconds": 0.0}
        self.done_units.update(units)
        self._pending, self._timings, self._last_flush = [], {"model_seconds": 0.0}, now

    def finish(self, out_path: Path) -> int:
        """Merge all parts into ``out_path`` (sorted by image_id); returns the row count."""
        parts_dir = contained(self.dir, self.work_dir)  # never remove anything outside the run's work folder
        self.flush()
        parts = sorted(self.dir.glob("part-*.parquet"))
        table = pa.concat_tables([pq.read_table(p) for p in parts]) if parts else self.schema.empty_table()
        # one chunk whatever the part layout, so the file's bytes do not depend on how units were split
        table = table.take(pc.sort_indices(table, [("image_id", "ascending")])).combine_chunks()
        with atomic_path(out_path) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        shutil.rmtree(parts_dir)
        return table.num_rows


SMALL_ROWS = 20_000  # predictions files up to this many rows are decoded on the calling thread
# a predictions file is bounded before it is big (the largest configs have ~10^5 rows of ~100 bytes; a row
# of top-1000 lists is 6 KB): at most this many rows, and this many bytes decoded
MAX_PREDICTION_ROWS = 2_000_000
MAX_DECODED_BYTES = 512 << 20


def read_predictions(path: str | Path, columns: list[str] | None = None, *, data: bytes | None = None) -> pa.Table:
    """Read one predictions file (the base and carried columns, or ``columns``), checking it has the base columns;
    ``data``: its bytes, read and hashed already. Bounded before it is big: footer, row count and declared sizes
    before any page is read, then strings read as dictionaries (a zstd "bomb" of one repeated value stays one
    value), counted as they would decode, batch by batch."""
    where = f"predictions file {path}"
    check_parquet_footer(path if data is None else data, where)
    src = (lambda: path) if data is None else (lambda: pa.BufferReader(data))
    try:
        with pq.ParquetFile(src()) as f:
            schema = f.schema_arrow
            md = f.metadata
        names = columns or [c for c in (*BASE_COLUMNS, *CARRIED_COLUMNS) if c in schema.names]
        fields = [schema.field(c) for c in names if c in schema.names]
        strings = [x.name for x in fields if pa.types.is_string(x.type) or pa.types.is_large_string(x.type)]
        width = sum(_width(x) for x in fields if x.name not in strings)
        declared = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
        if md.num_rows > MAX_PREDICTION_ROWS or max(declared, md.num_rows * width) > MAX_DECODED_BYTES:
            raise IntegrityError(f"{where} holds {md.num_rows:,} rows and {max(declared, md.num_rows * width):,} "
                                 f"bytes decompressed, over the limits of {MAX_PREDICTION_ROWS:,} rows and "
                                 f"{MAX_DECODED_BYTES >> 20} MiB; not a predictions file")
        batches, decoded = [], md.num_rows * width
        with pq.ParquetFile(src(), read_dictionary=strings) as f:
            # a thread pool per small file costs more than it decodes in parallel (a leaderboard check reads 15,000)
            for batch in f.iter_batches(batch_size=1 << 14, columns=[x.name for x in fields],
                                        use_threads=md.num_rows > SMALL_ROWS):
                decoded += sum(_string_bytes(batch[c]) for c in strings)
                if decoded > MAX_DECODED_BYTES:
                    raise IntegrityError(f"{where} decompresses to more than {MAX_DECODED_BYTES >> 20} MiB; not a "
                                         "predictions file")
                batches.append(batch)
        table = pa.Table.from_batches(batches) if batches else pa.schema(fields).empty_table()
        for c in strings:
            field = schema.field(c)
            table = table.set_column(table.schema.get_field_index(c), field, table[c].cast(field.type))
    except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise IntegrityError(f"{where} is not readable parquet ({e})") from None
    missing = [c for c in (columns or BASE_COLUMNS) if c in BASE_COLUMNS and c not in table.column_names]
    if missing:
        raise IntegrityError(f"{where} lacks column(s) {missing}")
    return table


def _width(f: pa.Field) -> int:
    """Bytes a row of a column decodes to; a column of variable width other than strings is refused."""
    t = f.type
    if pa.types.is_fixed_size_list(t):
        return t.list_size * _width(pa.field(f.name, t.value_type))
    try:
        return max(1, t.bit_width // 8)
    except ValueError:  # not fixed width (a list, a binary): nothing a predictions file holds
        raise IntegrityError(f"column {f.name!r} of type {t} is not a predictions column type") from None


def _string_bytes(col) -> int:
    """What a dictionary-encoded string column decodes to: the lengths of the values its indices take."""
    if not pa.types.is_dictionary(col.type):
        return col.nbytes
    lengths = pc.binary_length(col.dictionary).take(col.indices)
    return int(pc.sum(lengths).as_py() or 0) + 4 * len(col)


def topk_matrix(table: pa.Table) -> np.ndarray:
    """``topk_idx`` as an (n, K) int array."""
    col = table["topk_idx"].combine_chunks()
    k = col.type.list_size
    return col.flatten().to_numpy(zero_copy_only=False).reshape(-1, k)
