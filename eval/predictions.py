"""Per-image predictions files (one per model and suite config; ``docs/results.md``, "Predictions file"): the
schema and bounded reading (checkpointed writing with resume: ``genshift.eval.merging``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from genshift.errors import IntegrityError
from genshift.suite_format import check_parquet_footer

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


def first_per_class(ids: list[str], labels: list[int], limit: int) -> set[str]:
    """``limit_per_class``'s selection: the first ``limit`` image ids of each class in image_id order."""
    chosen, per_class = set(), Counter()
    for i, c in sorted(zip(ids, labels)):  # image ids are unique
        if per_class[c] < limit:
            per_class[c] += 1
            chosen.add(i)
    return chosen


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
